"""`agl run ID --health`: the installed command against a real ledger holding a run the trainer's way (progress.py,
the limits in the run's config summary as the trainer records them)."""

from __future__ import annotations

import json

from services.client import LedgerClient
from services.trainer.data.guardrails import DEFAULT_LIMITS, Guardrails
from services.trainer.run import progress

from .conftest import KEY, run_agl


async def test_health_table_marks_the_steps_over_a_limit(ledger, uid) -> None:
    run_id = f"health-{uid}"
    summary = {"algorithm": "grpo", "health_limits": Guardrails(DEFAULT_LIMITS).describe()}
    steps = {
        1: {"agl/health/rollouts_without_calls": 0.0, "agl/health/failed_calls": 0.0, "agl/reward/mean": 0.5},
        2: {"agl/health/rollouts_without_calls": 0.25, "agl/health/failed_calls": 0.0},
        3: {"agl/health/rollouts_without_calls": 0.75, "agl/health/failed_calls": 0.5, "agl/health/stopped": 1.0},
    }
    async with LedgerClient(ledger.address, KEY) as client:
        await progress.start_run(client, run_id, {"who": uid}, summary)
        for step, metrics in steps.items():
            await progress.report_step(client, run_id, step, metrics)
        await progress.finish_run(client, run_id, "health stop: step 3: agl/health/rollouts_without_calls=0.75 ...")
    shown = run_agl("run", run_id, "--health", ledger=ledger.address)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0] == f"run {run_id}  failed  3 steps"
    assert lines[1] == "error: health stop: step 3: agl/health/rollouts_without_calls=0.75 ..."
    table = {line.split()[0]: line.split()[1:] for line in lines[2:6]}
    assert table["METRIC"] == ["WARN/STOP", "step", "1", "step", "2", "step", "3"]
    assert table["rollouts_without_calls"] == ["0.1/0.5", "0", "0.25!", "0.75!!"]
    # failed_calls at exactly its stop limit 0.5 is over the warning limit only: a limit is passed when exceeded.
    assert table["failed_calls"] == ["0.05/0.5", "0", "0", "0.5!"]
    assert table["stopped"] == ["-", "-", "-", "1"]
    assert "step 2: agl/health/rollouts_without_calls=0.25 over the warn limit 0.1" in lines
    assert "step 3: agl/health/rollouts_without_calls=0.75 over the stop limit 0.5" in lines
    assert "agl/reward/mean" not in shown.out

    last = json.loads(run_agl("run", run_id, "--health", "--last", "1", "--json", ledger=ledger.address).out)
    assert last["state"] == "failed" and [s["step"] for s in last["steps"]] == [3]
    assert last["steps"][0]["over"] == {
        "agl/health/rollouts_without_calls": "stop",
        "agl/health/failed_calls": "warn",
    }
    assert last["limits"]["agl/health/logprob_gap"] == {"warn": 0.05, "stop": 0.5}


async def test_a_run_without_health_metrics_says_so(ledger, uid) -> None:
    run_id = f"old-{uid}"
    async with LedgerClient(ledger.address, KEY) as client:
        await progress.start_run(client, run_id, {}, {"algorithm": "grpo"})
        await progress.report_step(client, run_id, 1, {"agl/reward/mean": 0.5})
    shown = run_agl("run", run_id, "--health", ledger=ledger.address)
    assert shown.code == 0 and "(no health metrics reported" in shown.out
