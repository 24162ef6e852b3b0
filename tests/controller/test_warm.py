"""Warm launches of agent classes end to end: real controller, launcher, ledger, proxy and stand-in engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient, agent_token
from tests.controller.conftest import (
    KEY,
    Stack,
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
WARM = "tests.controller.agents.warm"
_LAUNCHER = re.compile(r"warm launch by launcher pid (\d+)")


def launcher_of(log_dir: Path, rollout_id: str) -> int | None:
    """The launcher that forked the rollout's agent (from its log header), or None for a fresh interpreter."""
    found = _LAUNCHER.search((log_dir / f"{rollout_id}.log").read_text())
    return int(found[1]) if found else None


async def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return [pid for pid in pids if pid_alive(pid)]


async def test_concurrent_rollouts_see_only_their_own_environment(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    out.mkdir()

    def env_spec(name: str, peers: int) -> rollout_pb2.RolloutSpec:
        env_map = {"OUT_DIR": "input.out", "NAME": "input.name", "PEERS": "input.peers"}
        task = {"out": str(out), "name": name, "peers": peers}
        return spec(agent_class=f"{WARM}:EnvAgent", env_map=env_map, input_value=task, timeout_s=60)

    with run_controller(stack, tmp_path) as controller:
        first, second = await ledger.create_rollouts([env_spec("a", 2), env_spec("b", 2)])
        done = await wait_for(ledger, [first.rollout_id, second.rollout_id])
        [third] = await ledger.create_rollouts([env_spec("c", 3)])
        done.update(await wait_for(ledger, [third.rollout_id]))
        launchers = {launcher_of(controller.log_dir, rid) for rid in done}
    assert all(r.status.state == SUCCEEDED for r in done.values()), {r.status.error_message for r in done.values()}
    assert len(launchers) == 1 and None not in launchers  # all three forked by one launcher
    pids = set()
    for name, created in (("a", first), ("b", second), ("c", third)):
        rid, aid = created.rollout_id, done[created.rollout_id].status.attempt_id
        seen = json.loads((out / f"{name}.json").read_text())
        pids.add(seen["pid"])
        # Exactly §3 and its env_map value: no other rollout's values, nothing an earlier agent set (LEAK, AGL_KEY).
        assert seen["env"] == {
            "AGL_OPENAI_BASE_URL": f"{stack.proxy_url}/proxy/rollout/{rid}/attempt/{aid}/mode/train/openai/v1",
            "AGL_EVENT_URL": f"{stack.proxy_url}/api/rollouts/{rid}/attempt/{aid}/events",
            "AGL_KEY": agent_token(KEY, rid, aid),
            "NAME": name,
        }
    assert len(pids) == 3


async def test_timeout_kills_the_whole_group_and_the_launcher_keeps_serving(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    pid_file = tmp_path / "family.pids"
    marks = tmp_path / "marks.txt"
    with run_controller(stack, tmp_path) as controller:
        [family] = await ledger.create_rollouts(
            [
                spec(
                    agent_class=f"{WARM}:FamilyAgent",
                    env_map={"PID_FILE": "input.pid_file"},
                    input_value={"pid_file": str(pid_file)},
                    timeout_s=4,
                )
            ]
        )
        pids = await asyncio.to_thread(host_pids, pid_file)
        rollout = (await wait_for(ledger, [family.rollout_id]))[family.rollout_id]
        launcher = launcher_of(controller.log_dir, family.rollout_id)
        assert await wait_gone(pids) == []
        assert launcher is not None and pid_alive(launcher)
        [after] = await ledger.create_rollouts(
            [spec(agent_class=f"{WARM}:MarkAgent", env_map={"MARKS": "input.marks"}, input_value={"marks": str(marks)})]
        )
        later = (await wait_for(ledger, [after.rollout_id]))[after.rollout_id]
        assert later.status.state == SUCCEEDED, later.status.error_message
        assert launcher_of(controller.log_dir, after.rollout_id) == launcher
    assert rollout.status.state == FAILED
    assert rollout.status.error_message.startswith("timed out after 4 s")
    assert len(pids) >= 4  # the agent, two children and the shell's own child
    assert pids[0] != launcher


async def test_crashing_agents_get_their_reasons_and_the_launcher_keeps_serving(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    names = ("ExitAgent", "SysExitAgent", "RaiseAgent", "SegfaultAgent")
    with run_controller(stack, tmp_path) as controller:
        created = await ledger.create_rollouts([spec(agent_class=f"{WARM}:{name}") for name in names])
        done = await wait_for(ledger, [r.rollout_id for r in created])
        [ok] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:ImportEnvAgent")])
        after = (await wait_for(ledger, [ok.rollout_id]))[ok.rollout_id]
        launchers = {launcher_of(controller.log_dir, r.rollout_id) for r in [*created, ok]}
        metrics = read_metrics(controller.metrics_url, {'agl_controller_rollouts_failed_total{reason="exit_code"}': 3})
    reason = {name: done[r.rollout_id].status.error_message for name, r in zip(names, created, strict=True)}
    assert all(done[r.rollout_id].status.state == FAILED for r in created), reason
    assert reason["ExitAgent"].startswith("agent exited with code 3 ")
    assert reason["ExitAgent"].endswith("leaving with os._exit(3)")
    assert reason["SysExitAgent"].startswith("agent exited with code 5 ")
    assert reason["RaiseAgent"].startswith("agent exited with code 1 ")
    assert reason["RaiseAgent"].endswith("ValueError: boom on purpose")
    assert reason["SegfaultAgent"].startswith("agent killed by SIGSEGV ")
    assert after.status.state == SUCCEEDED, after.status.error_message
    [launcher] = launchers  # every one forked by the same launcher, which outlived the crashes
    assert launcher is not None
    assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="exit_code"}') == 3
    assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="signal"}') == 1
    assert metric(metrics, 'agl_controller_launched_total{mode="warm"}') == 5


async def test_a_killed_launcher_fails_its_rollouts_and_is_restarted_without_launching_twice(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    pid_file = tmp_path / "family.pids"
    mark_env = {"env_map": {"MARKS": "input.marks"}, "input_value": {"marks": str(marks)}}
    family_env = {"env_map": {"PID_FILE": "input.pid_file"}, "input_value": {"pid_file": str(pid_file)}}
    with run_controller(stack, tmp_path) as controller:
        hanging = await ledger.create_rollouts(
            [spec(agent_class=f"{WARM}:HangAgent", **mark_env) for _ in range(2)]
            + [spec(agent_class=f"{WARM}:FamilyAgent", **family_env)]
        )
        await _wait_marked(marks, 2)
        family = await asyncio.to_thread(host_pids, pid_file)
        # Two agents, and one with children that ignore SIGTERM and a grandchild, all in their own groups.
        agents = [json.loads((controller.log_dir / f"{r.rollout_id}.pid").read_text())["pid"] for r in hanging]
        [launcher] = {launcher_of(controller.log_dir, r.rollout_id) for r in hanging}
        assert launcher is not None
        os.kill(launcher, signal.SIGKILL)
        done = await wait_for(ledger, [r.rollout_id for r in hanging])
        assert await wait_gone([*agents, *family]) == []
        [after] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:MarkAgent", **mark_env)])
        later = (await wait_for(ledger, [after.rollout_id]))[after.rollout_id]
        new_launcher = launcher_of(controller.log_dir, after.rollout_id)
        metrics = read_metrics(controller.metrics_url, {"agl_controller_launcher_restarts_total": 1})
        await asyncio.sleep(0.5)  # a second launch of a failed rollout would show in the marks by now
    for rollout in done.values():
        assert rollout.status.state == FAILED
        assert rollout.status.error_message.startswith("agent launcher died while the agent ran")
        assert "killed by SIGKILL" in rollout.status.error_message
    assert later.status.state == SUCCEEDED, later.status.error_message
    assert new_launcher is not None and new_launcher != launcher
    assert len(family) >= 4
    assert metric(metrics, "agl_controller_launcher_restarts_total") == 1
    assert metric(metrics, 'agl_controller_rollouts_failed_total{reason="launcher_died"}') == 3
    lines = [line.split() for line in marks.read_text().splitlines()]
    assert sorted(label for label, _, _ in lines) == ["hang", "hang", "mark"]
    assert len({url for _, url, _ in lines}) == 3  # one launch per attempt, none repeated


async def _wait_marked(marks: Path, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not marks.exists() or len(marks.read_text().splitlines()) < count:
        assert time.monotonic() < deadline, "agents did not start"
        await asyncio.sleep(0.05)


async def test_the_unmodified_math_agent_runs_warm_and_fresh(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    def math(fresh: bool) -> rollout_pb2.RolloutSpec:
        return spec(
            agent_class="examples.math_agent.agent:MathAgent",
            env_map={"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"},
            input_value={"question": "What is 2 + 3?", "answer": "5"},
            timeout_s=60,
            labels={"agl-launch": "fresh"} if fresh else {},
        )

    with run_controller(stack, tmp_path) as controller:
        created = await ledger.create_rollouts([math(fresh=False) for _ in range(4)] + [math(fresh=True)])
        done = await wait_for(ledger, [r.rollout_id for r in created], timeout_s=60)
        launchers = [launcher_of(controller.log_dir, r.rollout_id) for r in created]
        expected = {'agl_controller_agent_start_seconds_count{mode="warm"}': 4}
        expected['agl_controller_agent_start_seconds_count{mode="fresh"}'] = 1
        metrics = read_metrics(controller.metrics_url, expected)
        for rollout in done.values():
            assert rollout.status.state == SUCCEEDED, rollout.status.error_message
            events = await ledger.list_events(rollout.rollout_id, attempt_id=rollout.status.attempt_id)
            assert [e.WhichOneof("payload") for e in events] == ["model_request", "reward"]
    assert None not in launchers[:4] and len(set(launchers[:4])) == 1
    assert launchers[4] is None  # the label asked for a fresh interpreter
    assert metric(metrics, 'agl_controller_launched_total{mode="warm"}') == 4
    assert metric(metrics, 'agl_controller_launched_total{mode="fresh"}') == 1
    for mode in ("warm", "fresh"):
        assert metric(metrics, f'agl_controller_agent_start_seconds_count{{mode="{mode}"}}') == expected.get(
            f'agl_controller_agent_start_seconds_count{{mode="{mode}"}}'
        )
    assert metric(metrics, "agl_controller_launchers") == 1


async def test_modules_reading_the_environment_at_import_need_a_fresh_interpreter(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path) as controller:
        warm, fresh = await ledger.create_rollouts(
            [
                spec(agent_class=f"{WARM}:ImportEnvAgent"),
                spec(agent_class=f"{WARM}:ImportEnvAgent", labels={"agl-launch": "fresh"}),
            ]
        )
        done = await wait_for(ledger, [warm.rollout_id, fresh.rollout_id])
        seen = {
            r.rollout_id: json.loads((controller.log_dir / f"{r.rollout_id}.log").read_text().splitlines()[-1])
            for r in (warm, fresh)
        }
    assert all(r.status.state == SUCCEEDED for r in done.values())
    assert seen[warm.rollout_id]["at_import"] == ""  # imported once, in the launcher, before any rollout
    assert seen[warm.rollout_id]["now"].endswith(f"/{done[warm.rollout_id].status.attempt_id}/events")
    assert seen[fresh.rollout_id]["at_import"] == seen[fresh.rollout_id]["now"] != ""
    # Both see the arguments `python -m services.controller.core.agent_runner SPEC` would give, nothing of ours.
    assert seen[warm.rollout_id]["argv"] == seen[fresh.rollout_id]["argv"] == [f"{WARM}:ImportEnvAgent"]


_CHANGING = """
VERSION = {version}


class Agent:
    def run(self) -> None:
        print(f"agent version {{VERSION}}")
"""


async def test_a_changed_agent_module_gets_a_new_launcher(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    module = code / "changing_agent.py"
    module.write_text(_CHANGING.format(version=1))
    with run_controller(stack, tmp_path, args=["--workdir", str(code)]) as controller:
        [first] = await ledger.create_rollouts([spec(agent_class="changing_agent:Agent")])
        await wait_for(ledger, [first.rollout_id])
        old = launcher_of(controller.log_dir, first.rollout_id)
        module.write_text(_CHANGING.format(version=2))
        stat = module.stat()
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        [second] = await ledger.create_rollouts([spec(agent_class="changing_agent:Agent")])
        await wait_for(ledger, [second.rollout_id])
        new = launcher_of(controller.log_dir, second.rollout_id)
        logs = [(controller.log_dir / f"{r.rollout_id}.log").read_text() for r in (first, second)]
        assert old is not None and await wait_gone([old]) == []  # the replaced launcher exits
    assert "agent version 1" in logs[0]
    assert "agent version 2" in logs[1]
    assert new is not None and new != old


async def test_an_agent_module_that_starts_threads_runs_in_fresh_interpreters(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts([spec(agent_class="tests.controller.agents.threaded:ThreadedAgent")])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        metrics = read_metrics(controller.metrics_url, {'agl_controller_launched_total{mode="fresh"}': 1})
    assert rollout.status.state == SUCCEEDED, rollout.status.error_message
    assert launcher_of(controller.log_dir, created.rollout_id) is None
    assert metric(metrics, 'agl_controller_launched_total{mode="fresh"}') == 1
    assert "starts threads at import" in controller.process.log_text()


async def test_an_unknown_launch_label_fails_the_rollout_with_its_name(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path):
        [created] = await ledger.create_rollouts(
            [spec(agent_class=f"{WARM}:MarkAgent", labels={"agl-launch": "lukewarm"})]
        )
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert rollout.status.state == FAILED
    assert "agl-launch" in rollout.status.error_message and "lukewarm" in rollout.status.error_message


async def test_a_killed_controller_takes_its_warm_agents_along_and_the_next_run_reconciles(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    log_dir = tmp_path / "shared-logs"
    marks = tmp_path / "marks.txt"
    with run_controller(stack, tmp_path, controller_id="ctl-warm-restart", log_dir=log_dir) as first:
        [hang] = await ledger.create_rollouts(
            [spec(agent_class=f"{WARM}:HangAgent", env_map={"MARKS": "input.marks"}, input_value={"marks": str(marks)})]
        )
        await _wait_marked(marks, 1)
        agent = json.loads((log_dir / f"{hang.rollout_id}.pid").read_text())["pid"]
        launcher = launcher_of(log_dir, hang.rollout_id)
        assert launcher is not None
        first.process.kill()  # kill -9: the launcher sees its control socket close
        assert await wait_gone([agent, launcher]) == []
    with run_controller(stack, tmp_path, controller_id="ctl-warm-restart", log_dir=log_dir):
        rollout = (await wait_for(ledger, [hang.rollout_id]))[hang.rollout_id]
    assert rollout.status.state == FAILED
    assert "agent process gone after a controller restart" in rollout.status.error_message
    assert len(marks.read_text().splitlines()) == 1


async def test_an_idle_launcher_exits(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    with run_controller(stack, tmp_path, args=["--launcher-idle", "1"]) as controller:
        [created] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:ImportEnvAgent")])
        await wait_for(ledger, [created.rollout_id])
        launcher = launcher_of(controller.log_dir, created.rollout_id)
        assert launcher is not None
        assert await wait_gone([launcher], timeout_s=10) == []
        metrics = read_metrics(controller.metrics_url, {"agl_controller_launchers": 0})
    assert metric(metrics, "agl_controller_launchers") == 0


async def test_libraries_agents_import_lazily_are_preloaded_for_the_next_agents(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    async def preloaded(controller_log_dir: Path) -> list[bool]:
        seen = []
        for _ in range(2):
            [created] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:LazyImportAgent")])
            rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
            assert rollout.status.state == SUCCEEDED, rollout.status.error_message
            lines = (controller_log_dir / f"{created.rollout_id}.log").read_text().splitlines()
            seen.append(json.loads(lines[-1])["preloaded"])
            await asyncio.sleep(0.3)  # the launcher imports what it learned while no launch waits
        return seen

    with run_controller(stack, tmp_path) as controller:
        learning = await preloaded(controller.log_dir)
    with run_controller(stack, tmp_path, args=["--no-launcher-learn"]) as controller:
        not_learning = await preloaded(controller.log_dir)
    assert learning == [False, True]
    assert not_learning == [False, False]


async def test_a_launch_the_launcher_never_confirmed_is_failed_not_repeated(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    mark_env = {"env_map": {"MARKS": "input.marks"}, "input_value": {"marks": str(marks)}}
    with run_controller(stack, tmp_path) as controller:
        [first] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:MarkAgent", **mark_env)])
        await wait_for(ledger, [first.rollout_id])
        launcher = launcher_of(controller.log_dir, first.rollout_id)
        assert launcher is not None
        os.kill(launcher, signal.SIGSTOP)  # the launch request waits, unread, in its socket
        try:
            [lost] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:MarkAgent", **mark_env)])
            await wait_for(ledger, [lost.rollout_id], states=[RUNNING])
            await asyncio.sleep(0.5)
        finally:
            os.kill(launcher, signal.SIGKILL)
        failed = (await wait_for(ledger, [lost.rollout_id]))[lost.rollout_id]
        [after] = await ledger.create_rollouts([spec(agent_class=f"{WARM}:MarkAgent", **mark_env)])
        later = (await wait_for(ledger, [after.rollout_id]))[after.rollout_id]
        metrics = read_metrics(controller.metrics_url, {"agl_controller_launcher_restarts_total": 1})
    assert failed.status.state == FAILED
    assert failed.status.error_message.startswith("agent launcher died before confirming the launch")
    assert "not launched again" in failed.status.error_message
    assert later.status.state == SUCCEEDED, later.status.error_message
    assert metric(metrics, "agl_controller_launcher_restarts_total") == 1
    urls = [line.split()[1] for line in marks.read_text().splitlines()]
    assert len(urls) == 2 and not any(f"/{lost.rollout_id}/" in url for url in urls)


async def test_the_launcher_warms_the_agents_http_clients_unless_told_not_to(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    async def first_agent_saw(args: list[str]) -> bool:
        # A new controller, so a new launcher: its first agent runs before the launcher learned anything.
        with run_controller(stack, tmp_path, args=args) as controller:
            [created] = await ledger.create_rollouts(
                [spec(agent_class="tests.controller.agents.openai_client:FirstCallAgent")]
            )
            rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
            assert rollout.status.state == SUCCEEDED, rollout.status.error_message
            lines = (controller.log_dir / f"{created.rollout_id}.log").read_text().splitlines()
        return bool(json.loads(lines[-1])["chat_loaded"])

    assert await first_agent_saw([]) is True
    assert await first_agent_saw(["--no-launcher-warm-clients"]) is False
