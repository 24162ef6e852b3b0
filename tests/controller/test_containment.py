"""Local agents are contained (issue 30, finding 2): black-box, with the real controller, ledger and proxy.

An agent (tests/controller/agents/attacker.py), warm, fresh or a command, tries what the probe did: read the master
key from the controller's or the ledger's /proc entries (environment, command line) and call the ledger with it,
read another rollout's log file and token, and leave a `setsid` sleeper behind its timeout or its controller's
shutdown. Each attempt must fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.controller.local import agent_sandbox
from tests.controller.conftest import AGENTS, KEY, Stack, pid_alive, run_controller, spec, wait_for

FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
ATTACKER = "tests.controller.agents.attacker:AttackAgent"
MODES = ("warm", "fresh", "command")


def attacker(mode: str, env: dict[str, str], timeout_s: float = 60, rollout_id: str = "") -> rollout_pb2.RolloutSpec:
    if mode == "command":
        return spec(command=[sys.executable, str(AGENTS / "attacker.py")], env_map=env, timeout_s=timeout_s)
    labels = {"agl-launch": mode}
    return spec(agent_class=ATTACKER, env_map=env, timeout_s=timeout_s, labels=labels, rollout_id=rollout_id)


def report(log_path: Path) -> dict:
    """What the attacker found (its `ATTACK {...}` line)."""
    lines = [line for line in log_path.read_text().splitlines() if line.startswith("ATTACK ")]
    assert lines, log_path.read_text()
    return json.loads(lines[-1][len("ATTACK ") :])


def processes_with(marker: str) -> list[int]:
    """Live processes (host pids) whose command line holds marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def wait_until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.mark.parametrize("mode", MODES)
async def test_an_agent_finds_no_master_key_in_proc(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, mode: str
) -> None:
    # The ledger of the stack runs with `--key KEY` on its command line; the controller has AGL_KEY in its environment.
    with run_controller(stack, tmp_path) as controller:
        env = {"ATTACK": "secrets", "LEDGER_ADDR": stack.ledger.address}
        env["CONTROLLER_PID"] = str(controller.process.proc.pid)
        [created] = await ledger.create_rollouts([attacker(mode, env)])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        log_path = controller.log_dir / f"{created.rollout_id}.log"
        assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, log_path.read_text())
        found = report(log_path)
    assert KEY not in found["found"]
    assert found["ledger_accepted"] == []


@pytest.mark.parametrize("mode", MODES)
async def test_an_agent_cannot_read_another_rollouts_log_or_token(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, mode: str
) -> None:
    secret = f"victim-secret-{uuid.uuid4().hex}"
    victim = spec(command=[sys.executable, "-c", f"import time; print({secret!r}, flush=True); time.sleep(600)"])
    with run_controller(stack, tmp_path) as controller:
        [victim] = await ledger.create_rollouts([victim])
        victim_log = controller.log_dir / f"{victim.rollout_id}.log"
        await wait_until(lambda: victim_log.exists() and secret in victim_log.read_text(), "the victim never printed")
        running = (await wait_for(ledger, [victim.rollout_id], states=[RUNNING]))[victim.rollout_id]
        [created] = await ledger.create_rollouts([attacker(mode, {"ATTACK": "peek", "PEEK_PATH": str(victim_log)})])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        log_path = controller.log_dir / f"{created.rollout_id}.log"
        assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, log_path.read_text())
        found = report(log_path)
        await ledger.delete_rollouts([victim.rollout_id])
    assert running.status.attempt_id
    assert not found["read"] and secret not in found["content"]
    assert found["keys"] == {}  # not the victim's token, nor anyone else's key


@pytest.mark.parametrize("mode", MODES)
async def test_a_timeout_kills_what_the_agent_started_with_setsid(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, mode: str
) -> None:
    marker = f"agl-escapee-{uuid.uuid4().hex}"
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts([attacker(mode, {"ATTACK": "escape", "MARKER": marker}, timeout_s=8)])
        try:
            await wait_until(lambda: len(processes_with(marker)) == 2, "the sleepers never started")
            rollout = (await wait_for(ledger, [created.rollout_id], timeout_s=30))[created.rollout_id]
            assert rollout.status.state == FAILED
            assert rollout.status.failure_reason == rollout_pb2.FAILURE_REASON_TIMEOUT, rollout.status.error_message
            left = processes_with(marker)
        finally:
            kill_all(processes_with(marker))
        assert controller.process.alive()
    assert left == []


def descendants_named(root: int, name: str) -> list[int]:
    """Live descendants of root (zombies left out) whose command name is name."""
    parent_of, name_of = {}, {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split() if stat else []
        if fields and fields[0] != "Z":
            parent_of[int(entry.name)] = int(fields[1])
            name_of[int(entry.name)] = stat[stat.index("(") + 1 : stat.rindex(")")]

    def under_root(pid: int) -> bool:
        while pid in parent_of and pid != root:
            pid = parent_of[pid]
        return pid == root

    return [pid for pid, comm in name_of.items() if comm == name and pid != root and under_root(pid)]


@pytest.mark.parametrize("mode", MODES)
async def test_what_an_agent_left_running_with_setsid_ends_with_it(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, mode: str
) -> None:
    """The agent ends on its own (no timeout, no signal): its namespace goes with it, and so does the warm
    launcher's init of that namespace (a `cat` it started, sandbox.NamespaceFork)."""
    marker = f"agl-escapee-{uuid.uuid4().hex}"
    with run_controller(stack, tmp_path) as controller:
        env = {"ATTACK": "escape", "MARKER": marker, "THEN_EXIT": "1"}
        [created] = await ledger.create_rollouts([attacker(mode, env)])
        try:
            rollout = (await wait_for(ledger, [created.rollout_id], timeout_s=30))[created.rollout_id]
            log_path = controller.log_dir / f"{created.rollout_id}.log"
            assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, log_path.read_text())
            assert report(log_path) == {"escaped": True}
            await wait_until(lambda: processes_with(marker) == [], "the sleepers outlived their agent", 10)
        finally:
            kill_all(processes_with(marker))
        controller_pid = controller.process.proc.pid
        await wait_until(lambda: descendants_named(controller_pid, "cat") == [], "a namespace's init was left", 10)
        assert controller.process.alive()


async def test_controller_shutdown_kills_what_an_agent_started_with_setsid(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    marker = f"agl-escapee-{uuid.uuid4().hex}"
    try:
        with run_controller(stack, tmp_path) as controller:
            [created] = await ledger.create_rollouts([attacker("warm", {"ATTACK": "escape", "MARKER": marker})])
            await wait_until(lambda: len(processes_with(marker)) == 2, "the sleepers never started")
            controller.process.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(controller.process.proc.wait, 30)
        left = processes_with(marker)
    finally:
        kill_all(processes_with(marker))
    assert left == []
    rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert rollout.status.failure_reason == rollout_pb2.FAILURE_REASON_CONTROLLER_SHUTDOWN


async def test_the_key_file_keeps_the_master_key_from_agents(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    key_file = tmp_path / "agl.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    env = {"ATTACK": "peek", "PEEK_PATH": str(key_file)}
    with run_controller(stack, tmp_path, key=None, args=["--key-file", str(key_file)]) as controller:
        [peek, secrets] = await ledger.create_rollouts(
            [
                attacker("warm", env),
                attacker("command", {"ATTACK": "secrets", "LEDGER_ADDR": stack.ledger.address}),
            ]
        )
        done = await wait_for(ledger, [peek.rollout_id, secrets.rollout_id])
        assert all(r.status.state == SUCCEEDED for r in done.values()), [r.status.error_message for r in done.values()]
        assert done[peek.rollout_id].status.controller_id == controller.controller_id  # it talks to the ledger
        found = report(controller.log_dir / f"{peek.rollout_id}.log")
        controller_env = Path(f"/proc/{controller.process.proc.pid}/environ").read_bytes()
        searched = report(controller.log_dir / f"{secrets.rollout_id}.log")
    assert KEY not in found["content"]
    assert KEY.encode() not in controller_env
    assert searched["ledger_accepted"] == []


async def test_agents_run_as_the_agent_user(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    with run_controller(stack, tmp_path, args=["--agent-user", "nobody"]) as controller:
        [created] = await ledger.create_rollouts([spec(command=["sh", "-c", "id -u; id -g; id -G"])])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        lines = (controller.log_dir / f"{created.rollout_id}.log").read_text().splitlines()
    assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, lines)
    nobody = pwd.getpwnam("nobody")
    assert lines[-3:] == [str(nobody.pw_uid), str(nobody.pw_gid), str(nobody.pw_gid)]


def test_on_refuses_to_start_where_agents_cannot_be_contained(tmp_path: Path) -> None:
    policy = agent_sandbox.build_policy([str(tmp_path)], None)
    with pytest.raises(agent_sandbox.SandboxUnavailable, match=r"--agent-sandbox on: .*could not run"):
        agent_sandbox.resolve(agent_sandbox.ON, policy, python=str(tmp_path / "no-such-python"))
    contained, reason = agent_sandbox.resolve(agent_sandbox.AUTO, policy, python=str(tmp_path / "no-such-python"))
    assert contained is None and "could not run" in reason
    assert agent_sandbox.resolve(agent_sandbox.OFF, policy) == (None, "")
    assert agent_sandbox.resolve(agent_sandbox.AUTO, policy) == (policy, "")  # this host (CI runs as root) can


async def test_an_agent_working_in_the_log_directory_sees_it_empty(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "other-rollout.log").write_text("another rollout's secret\n")
    args = ["--workdir", str(log_dir)]
    with run_controller(stack, tmp_path, log_dir=log_dir, args=args) as controller:
        [created] = await ledger.create_rollouts(
            [attacker("command", {"ATTACK": "peek", "PEEK_PATH": "other-rollout.log"})]
        )
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        log_path = controller.log_dir / f"{created.rollout_id}.log"
        assert rollout.status.state == SUCCEEDED, (rollout.status.error_message, log_path.read_text())
        found = report(log_path)
    assert not found["read"]
