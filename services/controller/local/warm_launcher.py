"""The controller's side of one warm launcher process (services.controller.local.fork_server).

The controller never forks itself: it starts the launcher with exec, talks to it over a socketpair (JSON
lines) and learns from it when each child started and how it exited. A launch is sent at most once; an
answer lost with a dead launcher becomes LauncherDied for whoever waits on it, never a second launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agent_code import changed
from .sandbox import Policy

log = logging.getLogger(__name__)

_READ_LIMIT = 1 << 20


class LauncherError(Exception):
    """Base of the warm launcher's errors."""


class LauncherUnavailable(LauncherError):
    """The launcher could not be started (or cannot fork safely): run the agent in a fresh interpreter."""


class LaunchRefused(LauncherError):
    """The launcher answered that it forked nothing for this launch: it is safe to launch it elsewhere."""


class LauncherGone(LaunchRefused):
    """The launcher was dead or closing before the request was sent: ask the pool for a new one."""


class LauncherDied(LauncherError):
    """The launcher is gone; whatever it had not answered is lost (and its children were killed)."""


@dataclass
class _Child:
    started: asyncio.Future[int]
    exited: asyncio.Future[int]
    pid: int = 0


@dataclass(frozen=True)
class LauncherSettings:
    python: str
    env: Mapping[str, str] = field(repr=False)
    cwd: Path | None
    log_dir: Path
    notify_fd: int
    preload: tuple[str, ...] = ()
    learn: bool = True
    warm_clients: bool = True
    ready_timeout_s: float = 300.0
    # Every child contains itself under this policy (sandbox.contain) before the agent's code runs; None: not.
    sandbox: Policy | None = None


class WarmLauncher:
    """One fork server for one agent module: start(), launch(), wait(), signal(), close()."""

    def __init__(self, module: str, settings: LauncherSettings, on_death: Callable[[WarmLauncher], None]) -> None:
        self.module = module
        self.pid = 0
        self.files: dict[str, int] = {}
        self.import_error = ""
        self.dead = False
        self.death_reason = ""
        self.closing = False
        self.last_used = time.monotonic()
        self._settings = settings
        self._on_death = on_death
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._children: dict[str, _Child] = {}

    @property
    def log_path(self) -> Path:
        return self._settings.log_dir / f"{self.module}.log"

    @property
    def active(self) -> int:
        """Launches sent and not yet ended."""
        return len(self._children)

    def child_pids(self) -> set[int]:
        return {child.pid for child in self._children.values() if child.pid}

    def stale(self) -> str | None:
        """The first file of the agent's code that changed since the launcher imported it, else None."""
        return changed(self.files)

    async def start(self) -> None:
        """Starts the process and waits until it has imported the module. Raises LauncherUnavailable."""
        settings = self._settings
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [settings.python, "-m", "services.controller.local.fork_server", "--module", self.module]
        argv += ["--control-fd", str(theirs.fileno()), "--notify-fd", str(settings.notify_fd)]
        if settings.preload:
            argv += ["--preload", ",".join(settings.preload)]
        if not settings.learn:
            argv.append("--no-learn")
        if not settings.warm_clients:
            argv.append("--no-warm-clients")
        if settings.sandbox is not None:
            argv += ["--sandbox", *settings.sandbox.args("--sandbox-")]
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        try:
            with theirs, open(self.log_path, "ab") as out:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(settings.env),
                    cwd=settings.cwd,
                    pass_fds=(theirs.fileno(), settings.notify_fd),
                    start_new_session=True,
                )
        except (OSError, ValueError) as err:
            ours.close()
            raise LauncherUnavailable(f"cannot start the launcher for {self.module}: {err}") from err
        self.pid = self._proc.pid
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
        self._reader_task = asyncio.create_task(self._read(reader), name=f"launcher-{self.module}")
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), settings.ready_timeout_s)
        except asyncio.CancelledError:  # nothing forked yet: it need not be waited for
            await asyncio.shield(self.close(timeout_s=1.0))
            raise
        except (TimeoutError, LauncherDied) as err:
            await self.close()
            raise LauncherUnavailable(f"launcher for {self.module} not ready: {err} (log: {self.log_path})") from err
        self.files = {str(path): int(mtime) for path, mtime in ready.get("files", {}).items()}
        self.import_error = str(ready.get("error") or "")
        if int(ready.get("threads", 1)) > 1:
            await self.close()
            raise LauncherUnavailable(
                f"the agent module {self.module} starts threads at import ({ready['threads']} threads after "
                "importing it); forking it is unsafe"
            )
        log.info("launcher for %s ready (pid %d, watching %d file(s))", self.module, self.pid, len(self.files))

    async def launch(
        self,
        launch_id: str,
        spec: str,
        env: Mapping[str, str],
        log_path: Path,
        header: str,
        result_path: Path | None = None,
    ) -> int:
        """Asks for one child; returns its pid. Raises LaunchRefused (nothing forked) or LauncherDied.

        A number the agent's run() returns is written to result_path (see agent_runner)."""
        if self.dead or self.closing or self._writer is None:
            raise LauncherGone(f"launcher for {self.module} is {'dead' if self.dead else 'closing'}")
        loop = asyncio.get_running_loop()
        child = _Child(loop.create_future(), loop.create_future())
        self._children[launch_id] = child
        self.last_used = time.monotonic()
        message = {"op": "launch", "id": launch_id, "spec": spec, "env": dict(env), "log": str(log_path)}
        message["header"] = header
        if result_path is not None:
            message["result"] = str(result_path)
        self._writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        try:
            child.pid = await asyncio.shield(child.started)
        except LaunchRefused:
            self._children.pop(launch_id, None)
            raise
        return child.pid

    async def wait(self, launch_id: str, timeout_s: float | None = None) -> int | None:
        """The child's exit code (negative: killed by that signal), or None if it still runs after timeout_s."""
        child = self._children[launch_id]
        done, _ = await asyncio.wait({child.exited}, timeout=timeout_s)
        if not done:
            return None
        self._children.pop(launch_id, None)
        return child.exited.result()

    def signal(self, launch_id: str, signum: int) -> None:
        """Signals the child's whole process group (through the launcher, which knows whether it was reaped)."""
        if self._writer is not None and not self.dead and launch_id in self._children:
            message = {"op": "signal", "id": launch_id, "sig": int(signum)}
            self._writer.write(json.dumps(message).encode() + b"\n")

    async def close(self, timeout_s: float = 10.0) -> None:
        """End of file to the launcher: it kills what is left of its children and exits. One that does not within
        timeout_s (busy importing, so it reads no end of file) is killed with its group, after the process groups
        of the children it still had."""
        self.closing = True
        if self._writer is not None:
            self._writer.close()
        if self._proc is not None and self._proc.returncode is None:
            try:
                await asyncio.wait_for(self._proc.wait(), timeout_s)
            except TimeoutError:
                for pid in self.child_pids():
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.killpg(self._proc.pid, signal.SIGKILL)  # its own session: the launcher and anything it left
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                await self._proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task

    # -- messages from the launcher ------------------------------------------------------------------------

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self._on_message(json.loads(line))
        except (OSError, ValueError) as err:
            log.warning("launcher for %s: bad control stream: %s", self.module, err)
        finally:
            if self._writer is not None:
                self._writer.close()
            returncode = await self._proc.wait() if self._proc is not None else None
            self._died(returncode)

    def _on_message(self, message: dict[str, Any]) -> None:
        event = message.get("ev")
        if event == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
            return
        child = self._children.get(str(message.get("id")))
        if child is None:
            return
        if event == "started" and not child.started.done():
            child.started.set_result(int(message["pid"]))
        elif event == "refused" and not child.started.done():
            child.started.set_exception(LaunchRefused(str(message.get("reason", ""))))
        elif event == "exited" and not child.exited.done():
            child.exited.set_result(int(message["code"]))

    def _died(self, returncode: int | None) -> None:
        self.dead = True
        if self.closing:
            reason = "launcher stopped by the controller"
        elif returncode is not None and returncode < 0:
            reason = f"launcher pid {self.pid} killed by {_signal_name(-returncode)}"
        else:
            reason = f"launcher pid {self.pid} exited with code {returncode}"
        self.death_reason = reason
        if not self.closing:
            log.warning("launcher for %s died: %s; %d launch(es) lost", self.module, reason, self.active)
        # Its children got SIGKILL from the kernel when it died; their process groups may still hold more.
        for child in self._children.values():
            if child.pid and not child.exited.done():
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, signal.SIGKILL)
        error = LauncherDied(reason)
        for child in self._children.values():
            for future in (child.started, child.exited):
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved: a launch nobody awaits any more must not warn
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()
        self._on_death(self)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
