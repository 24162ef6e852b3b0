"""What the training fault tests share (test_trainer_kill.py, test_service_kills.py): the trainer command of a
run started (again) as an operator would, the signal sent the moment a point of a step is reached, and what the
run left in the ledger and in its files."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from services._gen.agl.v1 import proxy_control_pb2, rollout_pb2
from services.client import LedgerError
from services.stack import local_stack
from tests.support.engine import Engine
from tests.support.procs import processes_mentioning
from tests.trainer.cpu_stack import AGENT, KEY, Stack, trainer_overrides

TRAINER = Path(sys.executable).with_name("agl-trainer")
RUN = "killed"
STEPS = 4
LIVE = (rollout_pb2.ROLLOUT_STATE_QUEUING, rollout_pb2.ROLLOUT_STATE_RUNNING)


async def step_rollouts(stack: Stack, step: int, run_id: str = RUN) -> list[rollout_pb2.Rollout]:
    async with stack.client() as client:
        return await client.list_rollouts(labels={"agl_run": run_id, "agl_step": str(step)})


def running_rollouts(stack: Stack, step: int, run_id: str = RUN) -> bool:
    """Whether a rollout of the run's step is running (its agent at work)."""
    return any(
        r.status.state == rollout_pb2.ROLLOUT_STATE_RUNNING for r in asyncio.run(step_rollouts(stack, step, run_id))
    )


def paused_by_the_run(stack: Stack, run_id: str = RUN) -> bool:
    """Whether the proxies are paused by the run's trainer (a weight update in progress)."""

    async def control() -> proxy_control_pb2.ProxyControl:
        async with stack.client() as client:
            return await client.get_proxy_control()

    state = asyncio.run(control())
    return state.paused and state.owner == f"trainer:{run_id}"


async def reported_steps(stack: Stack, run_id: str = RUN) -> dict[int, dict[str, float]]:
    async with stack.client() as client:
        try:
            return {s.step: dict(s.metrics) for s in await client.list_run_steps(run_id)}
        except LedgerError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:  # not started yet
                return {}
            raise


def logged_steps(out: Path) -> collections.Counter[int]:
    path = out / "trajectories.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(json.loads(line)["step"] for line in lines if line.endswith("}"))


def commands(pids: list[int]) -> list[str]:
    """Each process's command line, with what tells where it came from: its state, its parent and its fate token."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
            state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            token = next((e.decode() for e in environ if e.startswith(b"AGL_TRAINER_FATE_TOKEN=")), "no fate token")
            found.append(f"{pid} (state {state}, parent {ppid}, {token}): {command}")
    return found


def checkpointed(out: Path) -> int:
    tracker = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    # verl rewrites the tracker in place (open "w", then write): read between the two, it is empty, which means
    # the new step is not checkpointed yet (a CI run read it so and failed on int('')).
    text = tracker.read_text().strip() if tracker.exists() else ""
    return int(text) if text else 0


class Trainer:
    """The trainer command of this run, started (again) in a session of its own."""

    def __init__(
        self,
        stack: Stack,
        engine: Engine,
        tasks: Path,
        out: Path,
        run_id: str = RUN,
        *,
        steps: int = STEPS,
        agent: str = AGENT,
        extra: Sequence[str] = ("trainer.save_freq=1",),
    ) -> None:
        self.argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
        self.argv += trainer_overrides(engine, run_id, tasks, out, steps=steps, lr=1e-3, agent=agent)
        self.argv += list(extra)
        self.env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
        self.out = out
        self.starts = 0

    def start(self) -> subprocess.Popen[str]:
        self.starts += 1
        with (self.out / f"trainer-{self.starts}.log").open("w") as log:
            return subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )

    def log(self, whole: bool = False) -> str:
        text = (self.out / f"trainer-{self.starts}.log").read_text()
        return text if whole else text[-6000:]


def wait_until(
    proc: subprocess.Popen[str], ready: Callable[[], bool], what: str, log: Callable[[], str], limit_s: float = 900
) -> None:
    """Returns the moment `ready()` holds (polled every 50 ms); fails if the trainer ends first."""
    deadline = time.monotonic() + limit_s
    while not ready():
        assert proc.poll() is None, f"the trainer ended before {what}:\n{log()}"
        assert time.monotonic() < deadline, f"never reached {what}:\n{log()}"
        time.sleep(0.05)


def kill_when(
    proc: subprocess.Popen[str],
    ready: Callable[[], bool],
    what: str,
    log: Callable[[], str],
    *,
    group: bool,
    sig: int = signal.SIGKILL,
) -> float:
    """The signal (kill -9 unless told) the moment `ready()` holds (polled every 50 ms): to the trainer's whole
    process group (its container or pod killed, Ctrl-C in its terminal) or to its own pid only (an operator's
    `kill PID`). Returns when it was sent, once the trainer has exited. If the moment never comes, the trainer's
    group is killed before the failure is raised, so that no trainer outlives its test into the next one."""
    try:
        wait_until(proc, ready, what, log)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        raise
    sent = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    return sent


def gone_after(out: Path, killed_at: float, limit_s: float = 60) -> float:
    """Seconds from the kill until no process of the run is left (its Ray workers, agents' launches aside)."""
    while processes_mentioning(str(out)):
        assert time.monotonic() - killed_at < limit_s, commands(processes_mentioning(str(out)))
        time.sleep(0.1)
    return time.monotonic() - killed_at
