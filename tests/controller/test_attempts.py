"""Attempts end to end with the local runner: real controller, ledger and proxy processes, real agents killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.controller.k8s.job_template import job_name
from tests.controller.conftest import (
    Stack,
    agent_command,
    in_host,
    metric,
    read_metrics,
    run_controller,
    spec,
    wait_for,
)
from tests.controller.k8s_standin import K8sStandin
from tests.controller.test_k8s import NS, job_spec, k8s_controller, wait_job

R = rollout_pb2
SUCCEEDED = R.ROLLOUT_STATE_SUCCEEDED
FAILED = R.ROLLOUT_STATE_FAILED


async def wait_file(path: Path, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.05)
    return json.loads(path.read_text())


async def test_a_killed_attempt_is_retried_and_the_rollout_succeeds_on_attempt_two(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    created_spec = spec(command=agent_command("flaky", str(tmp_path)), timeout_s=60, labels={"t": tmp_path.name})
    created_spec.config.retry.CopyFrom(R.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.5))
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts([created_spec])
        rid = created.rollout_id
        first = await wait_file(tmp_path / "first.json")
        [pid] = in_host(first["ns"], [first["pid"]])  # a contained agent tells its namespace's pid
        os.kill(pid, signal.SIGKILL)  # the pod's node died, the OOM killer struck: not the agent's answer
        # While attempt 2 runs, attempt 1's agent (had it survived) can no longer call the model: its token and URL
        # name a superseded attempt.
        deadline = time.monotonic() + 30
        while len((await ledger.get_rollout(rid)).status.attempts) < 2 or len(await ledger.list_events(rid, "*")) < 4:
            assert time.monotonic() < deadline, "attempt 2 did not get going"
            await asyncio.sleep(0.05)
        env = first["env"]
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "late"}], "max_tokens": 4}
            headers = {"Authorization": f"Bearer {env['AGL_KEY']}"}
            late_call = await http.post(f"{env['AGL_OPENAI_BASE_URL']}/chat/completions", json=body, headers=headers)
        (tmp_path / "release").touch()
        rollout = (await wait_for(ledger, [rid]))[rid]
        metrics = read_metrics(
            controller.metrics_url, {'agl_controller_attempts_ended_total{attempt="2",reason="succeeded"}': 1}
        )
    status = rollout.status
    assert status.state == SUCCEEDED, status.error_message
    attempt_1, attempt_2 = status.attempts
    assert (attempt_1.number, attempt_1.state, attempt_1.failure_reason) == (1, FAILED, R.FAILURE_REASON_KILLED)
    assert "SIGKILL" in attempt_1.error_message
    assert (attempt_2.number, attempt_2.state) == (2, SUCCEEDED)
    assert status.attempt_id == attempt_2.attempt_id != attempt_1.attempt_id
    # The second attempt started only after the policy's backoff.
    assert attempt_2.start_time.ToNanoseconds() - attempt_1.end_time.ToNanoseconds() >= 0.5e9

    # Events are split by attempt; the default (and the trainer's terminal feed) is the final attempt's.
    everything = await ledger.list_events(rid, attempt_id="*")
    assert [(e.attempt_id, e.event_type) for e in everything] == [
        (attempt_1.attempt_id, "model_request"),
        (attempt_1.attempt_id, "reward"),
        (attempt_2.attempt_id, "model_request"),
        (attempt_2.attempt_id, "reward"),
    ]
    assert [e.reward.value for e in await ledger.list_events(rid) if e.event_type == "reward"] == [1.0]
    entries = [e async for e in _terminal(ledger, tmp_path.name)]
    assert [e.rollout.rollout_id for e in entries] == [rid]
    assert {e.attempt_id for e in entries[0].events} == {attempt_2.attempt_id}

    assert late_call.status_code == 404, late_call.text
    assert attempt_1.attempt_id in late_call.text

    assert metric(metrics, 'agl_controller_attempts_retried_total{reason="signal"}') == 1
    assert metric(metrics, 'agl_controller_attempts_ended_total{attempt="1",reason="signal"}') == 1
    assert metric(metrics, 'agl_controller_attempts_ended_total{attempt="2",reason="succeeded"}') == 1
    assert "agl_controller_succeeded_total" not in metrics  # one family per fact: attempts_ended says it


async def _terminal(ledger: LedgerClient, label: str):
    page = await ledger.list_terminal(labels={"t": label}, include_events=True, page_size=1000)
    for entry in page.entries:
        yield entry


async def test_exhausted_attempts_fail_once_and_an_exit_code_is_not_retried_by_default(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    lost = spec(command=agent_command("exit", "3"), labels={"t": tmp_path.name})
    lost.config.retry.CopyFrom(R.RetryPolicy(max_attempts=3, retry_on=[R.FAILURE_REASON_EXIT_CODE]))
    answer = spec(command=agent_command("exit", "3"), labels={"t": tmp_path.name})
    answer.config.retry.CopyFrom(R.RetryPolicy(max_attempts=3))
    with run_controller(stack, tmp_path):
        retried, not_retried = await ledger.create_rollouts([lost, answer])
        done = await wait_for(ledger, [retried.rollout_id, not_retried.rollout_id])
    three = done[retried.rollout_id].status
    assert three.state == FAILED and len(three.attempts) == 3
    assert all(a.failure_reason == R.FAILURE_REASON_EXIT_CODE for a in three.attempts)
    assert all(a.error_message.startswith("agent exited with code 3") for a in three.attempts)
    assert len({a.attempt_id for a in three.attempts}) == 3
    one = done[not_retried.rollout_id].status
    assert one.state == FAILED and len(one.attempts) == 1
    assert one.failure_reason == R.FAILURE_REASON_EXIT_CODE
    entries = [e async for e in _terminal(ledger, tmp_path.name)]
    assert sorted(e.rollout.rollout_id for e in entries) == sorted([retried.rollout_id, not_retried.rollout_id])


async def test_an_evicted_job_is_retried_as_a_new_job_and_its_rollout_succeeds(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    created_spec = job_spec("What is 2 + 2?")
    created_spec.config.retry.CopyFrom(R.RetryPolicy(max_attempts=2))
    with k8s_controller(stack, tmp_path, k8s) as controller:
        [created] = await ledger.create_rollouts([created_spec])
        rid = created.rollout_id
        first = await asyncio.to_thread(wait_job, k8s, rid)
        k8s.evict_job(NS, first["metadata"]["name"])
        second_name = job_name(rid, 2)
        await asyncio.to_thread(k8s.wait_for, lambda: k8s.job(NS, second_name) is not None)
        second = k8s.job(NS, second_name)
        k8s.complete_job(NS, second_name)
        rollout = (await wait_for(ledger, [rid]))[rid]
        metrics = read_metrics(controller.metrics_url, {'agl_controller_attempts_retried_total{reason="evicted"}': 1})
    status = rollout.status
    assert status.state == SUCCEEDED, status.error_message
    attempt_1, attempt_2 = status.attempts
    assert attempt_1.failure_reason == R.FAILURE_REASON_LOST and "Evicted" in attempt_1.error_message
    assert attempt_1.launcher_ref == f"job:{NS}/{first['metadata']['name']}"
    assert attempt_2.launcher_ref == status.launcher_ref == f"job:{NS}/{second_name}"
    assert second["metadata"]["annotations"]["agl.io/attempt-id"] == attempt_2.attempt_id != attempt_1.attempt_id
    assert k8s.created == [first["metadata"]["name"], second_name]
    assert metric(metrics, 'agl_controller_attempts_retried_total{reason="evicted"}') == 1


async def test_a_failed_job_is_the_agents_answer_and_not_retried_by_default(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    created_spec = job_spec("What is 2 + 2?")
    created_spec.config.retry.CopyFrom(R.RetryPolicy(max_attempts=3))
    with k8s_controller(stack, tmp_path, k8s):
        [created] = await ledger.create_rollouts([created_spec])
        job = await asyncio.to_thread(wait_job, k8s, created.rollout_id)
        k8s.fail_job(NS, job["metadata"]["name"], exit_code=3)
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert rollout.status.state == FAILED
    assert [a.failure_reason for a in rollout.status.attempts] == [R.FAILURE_REASON_JOB_FAILED]
