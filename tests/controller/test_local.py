"""Local runner end to end: real controller processes, the real ledger and the real proxy."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token
from tests.controller.conftest import (
    KEY,
    Stack,
    agent_command,
    host_pids,
    metric,
    pid_alive,
    read_metrics,
    run_controller,
    spec,
    wait_for,
)

SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING


async def test_agent_calls_the_model_and_posts_a_reward_through_the_proxy(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts(
            [
                spec(
                    agent_class="tests.controller.agents.reward:RewardAgent",
                    env_map={"QUESTION": "input.question"},
                    input_value={"question": "What is 2 + 2?"},
                    timeout_s=60,
                )
            ]
        )
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        log_text = (controller.log_dir / f"{created.rollout_id}.log").read_text()
        assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, log_text)
        assert rollout.status.controller_id == controller.controller_id
        assert rollout.status.launcher_ref.startswith("local:")
        assert "reward posted" in log_text
        events = await ledger.list_events(created.rollout_id, attempt_id=rollout.status.attempt_id)
        kinds = [event.WhichOneof("payload") for event in events]
        assert kinds == ["model_request", "reward"]
        assert events[0].model_request.response_token_ids
        assert events[1].reward.value == 1.0
        assert all(event.attempt_id == rollout.status.attempt_id for event in events)
        ended = 'agl_controller_attempts_ended_total{attempt="1",reason="succeeded"}'
        metrics = read_metrics(controller.metrics_url, {ended: 1})
        assert metric(metrics, ended) == 1
        assert metric(metrics, 'agl_controller_launched_total{mode="warm"}') == 1
        assert metric(metrics, "agl_controller_launch_latency_seconds_count") == 1


async def test_agent_key_is_the_per_rollout_token_not_the_master_key(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    script = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('AGL_')}))"
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts([spec(command=[sys.executable, "-c", script], is_train=False)])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        assert rollout.status.state == SUCCEEDED, rollout.status.error_message
        lines = (controller.log_dir / f"{created.rollout_id}.log").read_text().splitlines()
    env = json.loads(lines[-1])
    rid, aid = created.rollout_id, rollout.status.attempt_id
    assert env == {
        "AGL_OPENAI_BASE_URL": f"{stack.proxy_url}/proxy/rollout/{rid}/attempt/{aid}/mode/val/openai/v1",
        "AGL_EVENT_URL": f"{stack.proxy_url}/api/rollouts/{rid}/attempt/{aid}/events",
        "AGL_KEY": agent_token(KEY, rid, aid),
    }
    # The proxy accepts the token for this rollout only.
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(env["AGL_EVENT_URL"], json={"event_type": "note", "data": {}}, headers={})
        assert reply.status_code == 401


async def test_failures_carry_precise_reasons(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    with run_controller(stack, tmp_path) as controller:
        nonzero, hang, missing, bad_class, no_program = await ledger.create_rollouts(
            [
                spec(command=agent_command("exit", "3")),
                spec(command=agent_command("hang"), timeout_s=1),
                spec(command=["true"], env_map={"ANSWER": "input.answer.value"}, input_value={"question": "q"}),
                spec(agent_class="no_such_module_xyz:Agent"),
                spec(command=["/nonexistent/agent-binary"]),
            ]
        )
        done = await wait_for(ledger, [r.rollout_id for r in (nonzero, hang, missing, bad_class, no_program)])
        logs = controller.log_dir
        reason = {rid: r.status.error_message for rid, r in done.items()}
        assert all(r.status.state == FAILED for r in done.values()), reason

        assert reason[nonzero.rollout_id].startswith("agent exited with code 3")
        assert str(logs / f"{nonzero.rollout_id}.log") in reason[nonzero.rollout_id]
        assert "giving up" in reason[nonzero.rollout_id]
        assert reason[hang.rollout_id].startswith("timed out after 1 s")
        assert "input.answer.value" in reason[missing.rollout_id]
        assert done[missing.rollout_id].status.attempt_id == ""  # failed from queuing: never launched
        assert not (logs / f"{missing.rollout_id}.log").exists()
        assert reason[bad_class.rollout_id].startswith("agent exited with code 2")
        assert "cannot load agent class" in (logs / f"{bad_class.rollout_id}.log").read_text()
        assert reason[no_program.rollout_id].startswith("spawn error")
        assert "/nonexistent/agent-binary" in reason[no_program.rollout_id]

        kinds = ("timeout", "spawn_error", "invalid_config")
        expected = {f'agl_controller_rollouts_failed_total{{reason="{kind}"}}': 1 for kind in kinds}
        metrics = read_metrics(controller.metrics_url, expected)
        assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="invalid_config"}') == 1
        assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="timeout"}') == 1
        assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="spawn_error"}') == 1


async def test_timeout_kills_the_whole_process_group(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    pid_file = tmp_path / "family.pids"
    with run_controller(stack, tmp_path):
        [created] = await ledger.create_rollouts([spec(command=agent_command("family", str(pid_file)), timeout_s=4)])
        pids = await asyncio.to_thread(host_pids, pid_file)
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert rollout.status.error_message.startswith("timed out after 4 s")
    assert len(pids) >= 4  # the agent, two children and the shell's own child
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert [pid for pid in pids if pid_alive(pid)] == []


async def test_concurrency_limit_is_respected(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    folder = tmp_path / "count"
    folder.mkdir()
    with run_controller(stack, tmp_path, args=["--max-concurrency", "2"]):
        created = await ledger.create_rollouts(
            [spec(command=agent_command("count", str(folder), f"r{i}")) for i in range(6)]
        )
        done = await wait_for(ledger, [r.rollout_id for r in created])
    assert all(r.status.state == SUCCEEDED for r in done.values())
    counts = [int(line.split()[1]) for line in (folder / "counts.txt").read_text().splitlines()]
    assert len(counts) == 6
    assert max(counts) <= 2


async def test_two_controllers_never_launch_a_rollout_twice(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    command = ["sh", "-c", 'echo "$AGL_EVENT_URL" >> "$MARK"']
    with run_controller(stack, tmp_path) as first, run_controller(stack, tmp_path) as second:
        created = await ledger.create_rollouts(
            [spec(command=command, env_map={"MARK": "input.mark"}, input_value={"mark": str(marks)}) for _ in range(60)]
        )
        done = await wait_for(ledger, [r.rollout_id for r in created], timeout_s=60)
    assert all(r.status.state == SUCCEEDED for r in done.values())
    assert {r.status.controller_id for r in done.values()} <= {first.controller_id, second.controller_id}
    launches = marks.read_text().split()
    assert len(launches) == len(created)
    expected = {f"{stack.proxy_url}/api/rollouts/{rid}/attempt/{r.status.attempt_id}/events" for rid, r in done.items()}
    assert set(launches) == expected


async def test_shutdown_kills_agents_fails_their_rollouts_and_stops_claiming(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path, args=["--max-concurrency", "2"]) as controller:
        created = await ledger.create_rollouts([spec(command=agent_command("hang")) for _ in range(3)])
        running = await _wait_running(ledger, controller.log_dir, 2)
        pids = [_agent_pid(controller.log_dir, rid) for rid in running]
        assert controller.process.terminate() == 0
    rollouts = {r.rollout_id: r for r in await ledger.list_rollouts()}
    for rid in running:
        assert rollouts[rid].status.state == FAILED
        assert rollouts[rid].status.error_message == "controller shutdown"
    [waiting] = [r.rollout_id for r in created if r.rollout_id not in running]
    assert rollouts[waiting].status.state == QUEUING
    assert not any(pid_alive(pid) for pid in pids)
    assert "stopped" in controller.process.log_text()


async def test_restart_reconciles_what_the_previous_run_left_running(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    log_dir = tmp_path / "shared-logs"
    with run_controller(stack, tmp_path, controller_id="ctl-restart", log_dir=log_dir) as first:
        orphaned, gone = await ledger.create_rollouts([spec(command=agent_command("hang")) for _ in range(2)])
        await _wait_running(ledger, log_dir, 2)
        orphan_pid = _agent_pid(log_dir, orphaned.rollout_id)
        gone_pid = _agent_pid(log_dir, gone.rollout_id)
        first.process.kill()  # kill -9: no chance to clean up; the agents survive in their own sessions
        os.killpg(gone_pid, signal.SIGKILL)
        assert pid_alive(orphan_pid)
    with run_controller(stack, tmp_path, controller_id="ctl-restart", log_dir=log_dir):
        done = await wait_for(ledger, [orphaned.rollout_id, gone.rollout_id])
    assert done[orphaned.rollout_id].status.state == FAILED
    assert "controller restarted while the agent ran" in done[orphaned.rollout_id].status.error_message
    assert done[gone.rollout_id].status.state == FAILED
    assert "agent process gone after a controller restart" in done[gone.rollout_id].status.error_message
    deadline = time.monotonic() + 5
    while pid_alive(orphan_pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not pid_alive(orphan_pid)


async def _wait_running(ledger: LedgerClient, log_dir: Path, count: int, timeout_s: float = 20) -> list[str]:
    """Ids of `count` running rollouts whose agent has written its pid file."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [r.rollout_id for r in await ledger.list_rollouts(states=[RUNNING])]
        if len(running) >= count and all((log_dir / f"{rid}.pid").exists() for rid in running):
            return running
        assert time.monotonic() < deadline, f"only {len(running)} running"
        await asyncio.sleep(0.05)


def _agent_pid(log_dir: Path, rollout_id: str) -> int:
    return json.loads((log_dir / f"{rollout_id}.pid").read_text())["pid"]


async def test_events_of_a_val_rollout_are_recorded_under_its_attempt(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    """A bare-bones agent (urllib only) posting an arbitrary event with the injected variables."""
    script = (
        "import os, json, urllib.request as u; "
        "body = json.dumps({'event_type': 'note', 'data': {'x': 1}}).encode(); "
        "r = u.Request(os.environ['AGL_EVENT_URL'], data=body, "
        "headers={'Authorization': 'Bearer ' + os.environ['AGL_KEY'], 'Content-Type': 'application/json'}); "
        "u.urlopen(r).read()"
    )
    with run_controller(stack, tmp_path):
        [created] = await ledger.create_rollouts([spec(command=[sys.executable, "-c", script], is_train=False)])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert rollout.status.state == SUCCEEDED, rollout.status.error_message
    events = await ledger.list_events(created.rollout_id, view=event_pb2.EVENT_VIEW_FULL)
    assert [(e.event_type, json.loads(e.data_json)) for e in events] == [("note", {"x": 1})]


async def test_label_selector_limits_what_a_controller_takes(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path, args=["--label-selector", "pool=a"]):
        other, mine = await ledger.create_rollouts(
            [spec(command=["true"], labels={"pool": "b"}), spec(command=["true"], labels={"pool": "a"})]
        )
        done = await wait_for(ledger, [mine.rollout_id])
        assert done[mine.rollout_id].status.state == SUCCEEDED
        assert (await ledger.get_rollout(other.rollout_id)).status.state == QUEUING
