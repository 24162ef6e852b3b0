"""Each failure mode produced on purpose by a real agent, through the real ledger, proxy, controller and stand-in
engine, and what the trainer makes of it: the rollout manager's consumed step, the infrastructure policy, the health
metrics by name with the rollouts behind them, and the warning or stop line the guardrails give.

The infrastructure faults come from outside the agent, as they do in life: a fault injector in the test SIGKILLs
the agents that announce themselves (a contained agent is its PID namespace's init, which cannot kill itself)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.stack import local_stack
from services.trainer.data import step_health as h
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.guardrails import DEFAULT_LIMITS, Limit, all_failed_line, evaluate
from services.trainer.data.infra_policy import InfraSettings, Policy, select
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager, StepResult
from services.trainer.rollouts.specs import LaunchSettings, Sample

pytestmark = pytest.mark.timeout(300)

KEY = "failure-modes-key"
MODEL = "agl-policy"
AGENT = "tests.trainer.faulty_agents:FaultyAgent"
KILLED = 2  # FailureReason KILLED; with LAUNCH_ERROR, LOST, LAUNCHER_DIED, CONTROLLER_SHUTDOWN the trainer's default
INFRA = [2, 4, 5, 6, 8]


@dataclass
class Stack:
    ledger: str
    root: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("failure-modes")
    specs = local_stack.load_compose({"AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL}, profiles=["standin"])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller", "standin")}
    plans = local_stack.localize(specs, root, {"controller": {"AGL_CONTROLLER_LOG_DIR": str(root / "agent-logs")}})
    with local_stack.run_stack(plans, local_stack.start_order(specs), root / "logs") as running:
        ledger = running["ledger"].address(50051)
        engine = f"http://{running['standin'].address(8000)}/v1"

        async def register() -> None:
            async with LedgerClient(ledger, key=KEY) as client:
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=engine)])

        asyncio.run(register())
        yield Stack(ledger, root)


def host_pid(namespace: str, pid: int) -> int:
    """The host's pid of the process known as `pid` in PID namespace `namespace` (the agent's own view)."""
    if namespace == os.readlink("/proc/self/ns/pid"):
        return pid
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspid[-1]) == pid:
            return int(entry.name)
    raise LookupError(f"no process {pid} in {namespace}")


@contextlib.asynccontextmanager
async def fault_injector(faults: Path, kill_once: set[str]) -> AsyncIterator[list[str]]:
    """SIGKILLs every agent that announces itself in `faults`, except a rollout of `kill_once` it already killed
    once (that one is spared). Yields the rollouts it killed, one entry per kill."""
    killed: list[str] = []
    seen: set[Path] = set()

    async def run() -> None:
        while True:
            for marker in sorted(faults.glob("*.json")):
                if marker in seen:
                    continue
                seen.add(marker)
                info = json.loads(marker.read_text())
                if info["rollout"] in kill_once and info["rollout"] in killed:
                    marker.with_suffix(".spared").touch()
                    continue
                os.kill(host_pid(info["ns"], info["pid"]), signal.SIGKILL)
                killed.append(info["rollout"])
            await asyncio.sleep(0.05)

    task = asyncio.create_task(run())
    try:
        yield killed
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def one_step(stack: Stack, run_id: str, tmp_path: Path, modes: list[str], *, n: int, retry: int) -> StepResult:
    faults = tmp_path / "faults"
    faults.mkdir()
    launch = LaunchSettings(
        timeout_seconds=60,
        agent_class=AGENT,
        env_map={"AGL_TASK": "input"},
        retry_attempts=retry,
        retry_on=tuple(INFRA),
    )
    settings = ManagerSettings(
        run_id=run_id, n=n, train_batch_size=len(modes), launch=launch, state_path=tmp_path / "state.json",
        progress=False, flush_interval_s=0.05,
    )  # fmt: skip
    samples = iter(
        [Sample(f"{mode}-{i}", {"q": f"task {i}", "mode": mode, "faults": str(faults)}) for i, mode in enumerate(modes)]
    )
    kill_once = {f"{run_id}-s1-g{i}-r{k}" for i, mode in enumerate(modes) if mode == "kill_once" for k in range(n)}
    client = LedgerClient(stack.ledger, key=KEY)
    manager = RolloutManager(client, settings)
    await manager.start()
    try:
        async with fault_injector(faults, kill_once) as killed:
            result = await asyncio.wait_for(manager.collect(1, samples), 240)
        result.metrics["test/kills"] = float(len(killed))
    finally:
        await manager.close()
        await client.close()
    return result


def ids(run_id: str, group: int, n: int) -> list[str]:
    return [f"{run_id}-s1-g{group}-r{k}" for k in range(n)]


async def test_agent_failures_are_counted_by_name_and_over_their_limit_stop(
    stack: Stack, run_id: str, tmp_path: Path
) -> None:
    modes = ["ok", "no_call", "reward_first", "no_reward", "crash", "bad_tool_call", "template_break"]
    result = await one_step(stack, run_id, tmp_path, modes, n=2, retry=2)
    traces = {t.rollout_id: t for t in result.traces}
    assert len(traces) == 14
    health = h.trace_health(result.traces, InfraSettings().reasons)
    assert health.rollouts(h.ROLLOUTS_WITHOUT_CALLS) == ids(run_id, 1, 2)
    assert health.value(h.ROLLOUTS_WITHOUT_CALLS) == 2 / 14
    assert health.rollouts(h.REWARD_BEFORE_LAST_CALL) == ids(run_id, 2, 2)
    # Succeeded: all but the two crashes (12); the two no_reward ones posted none.
    assert health.rollouts(h.SUCCEEDED_WITHOUT_REWARD) == ids(run_id, 3, 2)
    assert health.value(h.SUCCEEDED_WITHOUT_REWARD) == 2 / 12
    # The cut-off tool calls: written (the engine's marker left in the text), not parsed; the only tool calls made.
    assert health.rollouts(h.BAD_TOOL_CALLS) == ids(run_id, 5, 2) and health.value(h.BAD_TOOL_CALLS) == 1.0
    # The rewritten history: the second call does not continue the first one's row, a break and a second segment.
    counts = Counter(result.counts)
    rows = build_training_batch(select(result.traces, InfraSettings(), 2).kept, DataPathSettings(), counts=counts)
    assert rows.health is not None
    assert rows.health.rollouts(h.TRAJECTORY_BREAK_SHARE) == ids(run_id, 6, 2)
    assert rows.health.value(h.TRAJECTORY_BREAK_SHARE) == 1.0  # the only rollouts with a second call
    # The crash is the agent's own failure: failed, not the infrastructure's, still in its group with its calls.
    assert health.rollouts(h.FAILED_ROLLOUTS) == ids(run_id, 4, 2)
    assert health.value(h.INFRA_FAILED_ROLLOUTS) == 0.0
    crashed = traces[ids(run_id, 4, 2)[0]]
    assert crashed.failure_reason == "EXIT_CODE" and crashed.attempts == 1  # never retried
    assert "(log: " in crashed.error_message and "ValueError: no answer to 'task 4'" in crashed.error_message
    assert len(crashed.calls) == 1
    assert ids(run_id, 4, 2)[0] in [t.rollout_id for t in select(result.traces, InfraSettings(), 2).kept]

    # Over the limits: reward before the last call (0.2 of the rewards, warn 0) and succeeded without a reward
    # (0.25: warn 0.1) warn; rollouts without calls at 0.2 too. A stricter stop limit stops, naming the rollouts.
    lines = {b.name: (b.level, b.line) for b in evaluate(1, health, h.TRACE_NAMES, DEFAULT_LIMITS)}
    assert lines[h.REWARD_BEFORE_LAST_CALL][0] == "warn"
    assert lines[h.SUCCEEDED_WITHOUT_REWARD][0] == "warn"
    assert lines[h.ROLLOUTS_WITHOUT_CALLS] == (
        "warn",
        f"step 1: agl/health/rollouts_without_calls=0.1429 (2 of 14) over the warning limit 0.1; "
        f"rollouts: {', '.join(ids(run_id, 1, 2))}",
    )
    assert lines[h.BAD_TOOL_CALLS][0] == "stop"  # every tool call written failed: over 0.9
    row_lines = {b.name: b.level for b in evaluate(1, rows.health, h.ROW_NAMES, DEFAULT_LIMITS)}
    assert row_lines[h.TRAJECTORY_BREAK_SHARE] == "stop"
    strict = {**DEFAULT_LIMITS, h.ROLLOUTS_WITHOUT_CALLS: Limit(0.1, 0.12)}
    stops = [b.name for b in evaluate(1, health, h.TRACE_NAMES, strict) if b.level == "stop"]
    assert stops == [h.ROLLOUTS_WITHOUT_CALLS, h.BAD_TOOL_CALLS]
    assert all_failed_line(1, result.traces, InfraSettings().reasons) is None


async def test_killed_rollouts_are_retried_then_left_out_of_their_group(
    stack: Stack, run_id: str, tmp_path: Path
) -> None:
    # Group 0: both killed on their first attempt, spared on the retry. Group 1: killed on every attempt. Group 2 ok.
    result = await one_step(stack, run_id, tmp_path, ["kill_once", "kill", "ok"], n=2, retry=2)
    assert result.metrics["test/kills"] == 2 + 4
    traces = {t.rollout_id: t for t in result.traces}
    for rid in ids(run_id, 0, 2):
        assert traces[rid].succeeded and traces[rid].attempts == 2, traces[rid]
    for rid in ids(run_id, 1, 2):
        assert not traces[rid].succeeded and traces[rid].failure_reason == "KILLED" and traces[rid].attempts == 2
        assert "SIGKILL" in traces[rid].error_message
        assert len(traces[rid].calls) == 1  # it had asked the model: under the old behaviour it trained as a 0
    selection = select(result.traces, InfraSettings(policy=Policy.DROP_ROLLOUT), group_size=2)
    assert [t.rollout_id for t in selection.kept] == [*ids(run_id, 0, 2), *ids(run_id, 2, 2)]
    assert selection.metrics["agl/infra/killed"] == 2
    assert selection.metrics["agl/infra/dropped_rollouts"] == 2 and selection.metrics["agl/infra/dropped_groups"] == 1
    assert selection.metrics["agl/infra/retried_attempts"] == 4
    old = select(result.traces, InfraSettings(policy=Policy.SCORE), group_size=2)
    assert [t.reward for t in old.kept if t.group_id.endswith("-g1")] == [0.0, 0.0]
    health = h.trace_health(result.traces, InfraSettings().reasons)
    assert health.rollouts(h.INFRA_FAILED_ROLLOUTS) == ids(run_id, 1, 2)
    assert health.value(h.INFRA_FAILED_ROLLOUTS) == pytest.approx(1 / 3)


async def test_a_step_where_every_rollout_failed_names_the_first_agent_error(
    stack: Stack, run_id: str, tmp_path: Path
) -> None:
    result = await one_step(stack, run_id, tmp_path, ["crash", "crash"], n=2, retry=1)
    line = all_failed_line(1, result.traces, InfraSettings().reasons)
    assert line is not None
    first = ids(run_id, 0, 2)[0]
    log_path = stack.root / "agent-logs"
    assert line.startswith(f"step 1: every rollout failed (4 of 4); first: rollout {first} (EXIT_CODE): agent exited")
    assert f"(log: {log_path}" in line and line.endswith("ValueError: no answer to 'task 0'")
    assert "\n" not in line
