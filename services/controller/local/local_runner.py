"""Local runner: one process per rollout, in its own process group, output to a per-rollout log file.

Agent classes are forked by a warm launcher of their module (launcher_pool) unless the controller runs with
--agent-launch fresh or the rollout carries the label `agl-launch: fresh`; those, and commands, start as new
processes. Either way the agent runs in its own session with the rollout's environment, its timeout kills
its whole process group (SIGTERM, then SIGKILL after the grace period), and its exit is reported once.

With a sandbox policy (the controller's --agent-sandbox, see sandbox.py) every agent, warm or fresh, runs contained:
its own PID and mount namespaces (the services, the launchers and other rollouts out of sight; everything it started
killed when it ends or is killed, `setsid` or not), no capabilities, the log directory and the key file hidden.
Log files are created 0600 either way.

A warm launch falls back to a fresh one within the same run(), and both end through the same pid file, running
notice and exit outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2

from ..core.agent_env import agent_env, resolve_env_map
from ..core.metrics import ControllerMetrics
from ..core.outcome import LAUNCHER_DIED, SPAWN_ERROR, VANISHED, ConfigError, Outcome, exit_outcome, timed_out
from ..core.returned_reward import take_returned
from ..core.runner import LaunchPlan, template_context, timeout_of
from .launch_target import local_argv, split_agent_class
from .launcher_pool import LauncherPool
from .running_notices import RunningNotices
from .sandbox import Policy
from .warm_launcher import (
    LauncherDied,
    LauncherGone,
    LauncherSettings,
    LauncherUnavailable,
    LaunchRefused,
    WarmLauncher,
)

log = logging.getLogger(__name__)

_TAIL_BYTES = 4096
_MAX_LAST_LINE = 300
_HEADER = "=== agl rollout "
SANDBOX_FILE = str(Path(__file__).with_name("sandbox.py"))
# Per-rollout switch (a metadata label) between a warm launch and a fresh interpreter for an agent class.
LAUNCH_LABEL = "agl-launch"
WARM, FRESH, COMMAND = "warm", "fresh", "command"


@dataclass(frozen=True)
class LocalLaunch:
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    pid_path: Path
    # COMMAND (argv as given), FRESH (argv runs agent_runner on agent_class) or WARM (a launcher forks it).
    mode: str = COMMAND
    agent_class: str = ""
    # Where agent_runner writes a number the agent class's run() returns (agent classes only).
    result_path: Path | None = None


def file_stem(rollout_id: str) -> str:
    """A file name for the rollout: its id when that is safe, else a safe part plus a hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", rollout_id)[:100].lstrip(".")
    if safe == rollout_id and safe:
        return safe
    return f"{safe}-{hashlib.sha256(rollout_id.encode()).hexdigest()[:10]}"


def last_line(path: Path) -> str:
    """The last non-empty line of a log file (bounded), or ""."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - _TAIL_BYTES, 0))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith(_HEADER):
            return ""  # the agent wrote nothing after its start line
        if line.strip():
            return line.strip()[:_MAX_LAST_LINE]
    return ""


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process (clock ticks since boot), to tell it from a later one with the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # fields[0] is field 3 of stat (the state; a zombie counts as gone), fields[19] field 22 (start time).
    if len(fields) <= 19 or fields[0] == "Z":
        return None
    return int(fields[19])


def _private(path: Path) -> int:
    """The log file opened for appending, created readable by the controller's user only."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _signal_group(pgid: int, signum: int) -> bool:
    """Sends signum to the process group; False when the group is gone."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %d", pgid)
        return False
    return True


class LocalRunner:
    """Runs each attempt as `argv` with the controller's environment, §3 and env_map; kills the group on timeout."""

    name = "local"
    kills_on_shutdown = True

    def __init__(
        self,
        *,
        agent_url: str,
        key: str | None,
        log_dir: Path,
        base_env: Mapping[str, str],
        default_timeout_s: float,
        kill_grace_s: float,
        python: str,
        workdir: Path | None = None,
        metrics: ControllerMetrics | None = None,
        agent_launch: str = WARM,
        launcher_preload: tuple[str, ...] = (),
        launcher_learn: bool = True,
        launcher_warm_clients: bool = True,
        launcher_idle_s: float = 600.0,
        sandbox: Policy | None = None,
    ) -> None:
        if agent_launch not in (WARM, FRESH):
            raise ValueError(f"agent_launch must be {WARM!r} or {FRESH!r}, not {agent_launch!r}")
        self._agent_url = agent_url
        self._key = key
        self._log_dir = log_dir
        self._base_env = dict(base_env)
        self._default_timeout_s = default_timeout_s
        self._kill_grace_s = kill_grace_s
        self._python = python
        self._workdir = workdir
        self._metrics = metrics or ControllerMetrics()
        self._agent_launch = agent_launch
        self._launcher_options = (launcher_preload, launcher_learn, launcher_warm_clients, launcher_idle_s)
        self._sandbox = sandbox
        self._notices: RunningNotices | None = None
        self._pool: LauncherPool | None = None

    async def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._notices = RunningNotices()
        self._notices.start()
        preload, learn, warm_clients, idle_s = self._launcher_options
        settings = LauncherSettings(
            python=self._python,
            env=self._base_env,
            cwd=self._workdir,
            log_dir=self._log_dir / "launchers",
            notify_fd=self._notices.send_fd,
            preload=preload,
            learn=learn,
            warm_clients=warm_clients,
            sandbox=self._sandbox,
        )
        self._pool = LauncherPool(settings, self._metrics, idle_s=idle_s)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._notices is not None:
            self._notices.close()

    def log_path(self, rollout_id: str) -> Path:
        return self._log_dir / f"{file_stem(rollout_id)}.log"

    def _pid_path(self, rollout_id: str) -> Path:
        return self._log_dir / f"{file_stem(rollout_id)}.pid"

    async def prepare(self, rollout: rollout_pb2.Rollout, attempt_id: str) -> LaunchPlan:
        local = rollout.config.local
        argv = local_argv(list(local.command), local.agent_class, self._python)
        mode = COMMAND if local.command else self._launch_mode(rollout)
        agent_class = ":".join(split_agent_class(local.agent_class)) if mode != COMMAND else ""
        extra = resolve_env_map(dict(local.env_map), template_context(rollout, attempt_id))
        env = {**self._base_env, **extra}
        env.update(agent_env(self._agent_url, rollout.rollout_id, attempt_id, rollout.is_train, self._key))
        log_path = self.log_path(rollout.rollout_id)
        stem = file_stem(rollout.rollout_id)
        result = None if mode == COMMAND else self._log_dir / f"{stem}.{attempt_id}.returned"
        launch = LocalLaunch(argv, env, log_path, self._pid_path(rollout.rollout_id), mode, agent_class, result)
        return LaunchPlan(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt_id,
            launcher_ref=f"local:{log_path}",
            timeout_s=timeout_of(rollout, self._default_timeout_s),
            detail=launch,
        )

    def _launch_mode(self, rollout: rollout_pb2.Rollout) -> str:
        mode = rollout.metadata.labels.get(LAUNCH_LABEL, self._agent_launch)
        if mode not in (WARM, FRESH):
            raise ConfigError(f"label {LAUNCH_LABEL} must be {WARM!r} or {FRESH!r}, not {mode!r}")
        return mode

    async def admit(self) -> None:
        return None

    async def run(self, plan: LaunchPlan, launched: Callable[[str], None]) -> Outcome:
        launch: LocalLaunch = plan.detail
        claimed = time.monotonic()
        if launch.mode == WARM:
            try:
                return await self._run_warm(plan, launch, launched, claimed)
            except LauncherUnavailable as err:
                log.info("rollout %s: no warm launch (%s); starting a fresh interpreter", plan.rollout_id, err)
        return await self._run_process(plan, launch, launched, claimed)

    def _expect_running(self, plan: LaunchPlan, mode: str, claimed: float) -> None:
        """Observes claim -> agent code running once the agent's notice arrives."""
        histogram = self._metrics.agent_start.labels(mode)

        def running(when: float) -> None:
            histogram.observe(max(when - claimed, 0.0))

        if self._notices is not None:
            self._notices.expect(plan.attempt_id, running)

    async def _run_warm(
        self, plan: LaunchPlan, launch: LocalLaunch, launched: Callable[[str], None], claimed: float
    ) -> Outcome:
        """Forked by the module's launcher. Raises LauncherUnavailable when nothing was forked (run it fresh)."""
        assert self._pool is not None
        module = launch.agent_class.partition(":")[0]
        where = f"(log: {launch.log_path})"
        self._expect_running(plan, WARM, claimed)
        for tries_left in (1, 0):
            try:
                launcher = await asyncio.wait_for(self._pool.acquire(module), plan.timeout_s)
            except TimeoutError:
                self._forget(plan)
                reason = f"(the launcher was still importing {module}; log: {self._log_dir / 'launchers'})"
                return timed_out(plan.timeout_s, reason)
            except LauncherUnavailable:
                self._forget(plan)
                raise
            header = f"{_HEADER}{plan.rollout_id} attempt {plan.attempt_id}: {launch.agent_class} "
            header += f"(warm launch by launcher pid {launcher.pid})\n"
            try:
                pid = await launcher.launch(
                    plan.attempt_id, launch.agent_class, launch.env, launch.log_path, header, launch.result_path
                )
                break
            except LauncherGone as err:  # died or retired since acquire(): nothing was sent, so ask again
                if not tries_left:
                    self._forget(plan)
                    raise LauncherUnavailable(str(err)) from err
            except LaunchRefused as err:
                self._forget(plan)
                self._pool.refused(launcher, str(err))
                raise LauncherUnavailable(f"launcher refused: {err}") from err
            except LauncherDied as err:
                self._forget(plan)
                self._pool.released(launcher)
                reason = f"agent launcher died before confirming the launch ({err}); not launched again {where}"
                return Outcome.failure(LAUNCHER_DIED, reason)
        self._write_pid(launch.pid_path, pid, plan.attempt_id)
        log.info("rollout %s: attempt %s forked as pid %d", plan.rollout_id, plan.attempt_id, pid)
        launched(WARM)
        try:
            try:
                returncode = await launcher.wait(plan.attempt_id, plan.timeout_s)
            except LauncherDied as err:
                reason = f"agent launcher died while the agent ran ({err}); its process group was killed {where}"
                return Outcome.failure(LAUNCHER_DIED, reason)
            except asyncio.CancelledError:
                await asyncio.shield(self._kill_warm(launcher, plan.attempt_id))
                raise
            if returncode is None:
                log.info("rollout %s: timed out after %gs; killing its process group", plan.rollout_id, plan.timeout_s)
                await self._kill_warm(launcher, plan.attempt_id)
                return timed_out(plan.timeout_s, where)
        finally:
            self._forget(plan)
            with contextlib.suppress(OSError):
                launch.pid_path.unlink()
            self._pool.released(launcher)
            returned = take_returned(launch.result_path)
        return self._exit_outcome(plan, launch, returncode, returned)

    async def _kill_warm(self, launcher: WarmLauncher, launch_id: str) -> None:
        """SIGTERM to the child's group, SIGKILL after the grace period; the launcher reaps and reports."""
        try:
            launcher.signal(launch_id, signal.SIGTERM)
            if await launcher.wait(launch_id, self._kill_grace_s) is None:
                launcher.signal(launch_id, signal.SIGKILL)
                await launcher.wait(launch_id, 30.0)
        except (LauncherDied, KeyError):
            return

    def _forget(self, plan: LaunchPlan) -> None:
        if self._notices is not None:
            self._notices.forget(plan.attempt_id)

    def _exit_outcome(
        self, plan: LaunchPlan, launch: LocalLaunch, returncode: int, returned: float | None = None
    ) -> Outcome:
        outcome = exit_outcome(returncode, f"(log: {launch.log_path})")
        if not outcome.succeeded and (line := last_line(launch.log_path)):
            outcome = Outcome(False, f"{outcome.reason}: {line}", outcome.kind)
        elif outcome.succeeded and returned is not None:
            outcome = Outcome(True, returned_reward=returned)
        log.info("rollout %s: agent exited with %d", plan.rollout_id, returncode)
        return outcome

    async def _run_process(
        self, plan: LaunchPlan, launch: LocalLaunch, launched: Callable[[str], None], claimed: float
    ) -> Outcome:
        argv, pass_fds = launch.argv, []
        if launch.mode != COMMAND and self._notices is not None:
            # agent_runner tells when the agent's code runs: python -m RUNNER --notify-fd N --launch-id ID spec
            fd = self._notices.send_fd
            argv = [*argv[:3], "--notify-fd", str(fd), "--launch-id", plan.attempt_id, *argv[3:]]
            pass_fds.append(fd)
            self._expect_running(plan, FRESH, claimed)
        where = f"(log: {launch.log_path})"
        missing = self._missing_program(launch)
        if missing is not None:
            self._forget(plan)
            log.warning("rollout %s: spawn error: %s", plan.rollout_id, missing)
            return Outcome.failure(SPAWN_ERROR, f"spawn error: cannot start {launch.argv[0]!r}: {missing} {where}")
        result_fd = -1
        with open(_private(launch.log_path), "ab") as log_file:
            log_file.write(f"{_HEADER}{plan.rollout_id} attempt {plan.attempt_id}: ".encode())
            log_file.write(f"{shlex.join(launch.argv)}\n".encode(errors="replace"))
            log_file.flush()
            try:
                if launch.result_path is not None:  # opened here: a contained agent cannot open the log directory
                    result_fd = os.open(launch.result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    argv = [*argv[:3], "--result-fd", str(result_fd), *argv[3:]]
                    pass_fds.append(result_fd)
                if self._sandbox is not None:
                    argv = [self._python, "-I", "-S", SANDBOX_FILE, *self._sandbox.args(), "--", *argv]
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=launch.env,
                    cwd=self._workdir,
                    pass_fds=pass_fds,
                    start_new_session=True,
                )
            except (OSError, ValueError) as err:
                self._forget(plan)
                if launch.result_path is not None:
                    with contextlib.suppress(OSError):
                        launch.result_path.unlink()
                log.warning("rollout %s: spawn error: %s", plan.rollout_id, err)
                return Outcome.failure(SPAWN_ERROR, f"spawn error: cannot start {launch.argv[0]!r}: {err} {where}")
            finally:
                if result_fd >= 0:
                    os.close(result_fd)
        self._write_pid(launch.pid_path, proc.pid, plan.attempt_id)
        log.info("rollout %s: attempt %s started as pid %d", plan.rollout_id, plan.attempt_id, proc.pid)
        launched(COMMAND if launch.mode == COMMAND else FRESH)  # a warm one that fell back is fresh
        try:
            try:
                returncode = await asyncio.wait_for(proc.wait(), plan.timeout_s)
            except TimeoutError:
                log.info("rollout %s: timed out after %gs; killing its process group", plan.rollout_id, plan.timeout_s)
                await self._kill_group(proc)
                return timed_out(plan.timeout_s, where)
            except asyncio.CancelledError:
                await asyncio.shield(self._kill_group(proc))
                raise
            # Leftover children of a finished agent do not outlive its rollout.
            _signal_group(proc.pid, signal.SIGKILL)
        finally:
            self._forget(plan)
            with contextlib.suppress(OSError):
                launch.pid_path.unlink()
            returned = take_returned(launch.result_path)
        return self._exit_outcome(plan, launch, returncode, returned)

    def _missing_program(self, launch: LocalLaunch) -> OSError | None:
        """Why the agent's program cannot be started, looked up as exec would (PATH of its environment, relative to
        its working directory), or None. Contained, the sandbox starts it: a missing program is still a spawn error."""
        if self._sandbox is None:
            return None
        program = launch.argv[0]
        if "/" in program:
            path = Path(self._workdir or ".") / program
            found = path.is_file() and os.access(path, os.X_OK)
        else:
            found = shutil.which(program, path=launch.env.get("PATH", os.defpath)) is not None
        if found:
            return None
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)

    async def _kill_group(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM to the group, SIGKILL to whatever is left of it after the grace period."""
        pgid = proc.pid
        if _signal_group(pgid, signal.SIGTERM):
            deadline = time.monotonic() + self._kill_grace_s
            while time.monotonic() < deadline and _signal_group(pgid, 0):
                await asyncio.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        await proc.wait()

    def _write_pid(self, path: Path, pid: int, attempt_id: str) -> None:
        record = {"pid": pid, "start_ticks": process_start_ticks(pid), "attempt_id": attempt_id}
        try:
            path.write_text(json.dumps(record))
        except OSError as err:
            log.warning("cannot write pid file %s: %s", path, err)

    async def resume(self, rollout: rollout_pb2.Rollout, cause: str = "") -> Outcome:
        """A local agent cannot be re-attached: kill what is left of it and fail the rollout with the reason. After a
        restart the pid file tells; for a takeover (`cause`) it tells only when the dead controller shared this
        host and log directory, and otherwise the agent's process was not observed."""
        rollout_id = rollout.rollout_id
        pid_path = self._pid_path(rollout_id)
        where = f"(log: {self.log_path(rollout_id)})"
        try:
            record = json.loads(pid_path.read_text())
        except (OSError, ValueError):
            record = {}
        pid = record.get("pid")
        alive = (
            isinstance(pid, int)
            and record.get("attempt_id") == rollout.status.attempt_id
            and record.get("start_ticks") is not None
            and process_start_ticks(pid) == record.get("start_ticks")
        )
        with contextlib.suppress(OSError):
            pid_path.unlink()
        if alive and _signal_group(pid, signal.SIGKILL):
            done = f"killed its process group {pid}"
            reason = f"{cause}; {done}" if cause else f"controller restarted while the agent ran; {done} {where}"
        elif cause:
            reason = f"{cause}; its agent process was not observed"
        else:
            reason = f"agent process gone after a controller restart; its exit status is unknown {where}"
        log.info("rollout %s: %s", rollout_id, reason)
        return Outcome.failure(VANISHED, reason)
