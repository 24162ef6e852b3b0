"""Warm launchers by agent module: started on first use, replaced when they die or the agent's code changes.

acquire(module) returns the module's launcher, starting one when there is none, when the previous one died
(a restart, counted) or when a file of the agent's code changed since it was imported (the old launcher
finishes the rollouts it runs, takes no new ones and exits). A module whose launcher cannot start, or
cannot fork safely, runs in fresh interpreters for a while (LauncherUnavailable), retried after a pause
or as soon as its code changes. A launcher without rollouts for idle_s seconds is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace

from ..core.metrics import ControllerMetrics
from .agent_code import changed
from .warm_launcher import LauncherSettings, LauncherUnavailable, WarmLauncher

log = logging.getLogger(__name__)

_RETRY_UNAVAILABLE_S = 60.0


@dataclass
class _Unavailable:
    reason: str
    since: float
    files: dict[str, int]


class LauncherPool:
    def __init__(self, settings: LauncherSettings, metrics: ControllerMetrics, idle_s: float = 600.0) -> None:
        self._settings = settings
        self._metrics = metrics
        self._idle_s = idle_s
        self._live: dict[str, WarmLauncher] = {}
        self._starting: dict[str, asyncio.Task[WarmLauncher]] = {}
        self._retiring: set[WarmLauncher] = set()
        self._unavailable: dict[str, _Unavailable] = {}
        self._died: set[str] = set()  # modules whose last launcher died unexpectedly: the next start is a restart
        self._no_learn: set[str] = set()  # modules whose lazily imported libraries made forking unsafe
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def acquire(self, module: str) -> WarmLauncher:
        """The module's launcher, ready to fork. Raises LauncherUnavailable: run the agent in a fresh interpreter."""
        self._stop_idle()
        launcher = self._live.get(module)
        if launcher is not None:
            if launcher.dead:
                del self._live[module]
            elif (path := launcher.stale()) is not None:
                log.info("agent code changed (%s): replacing the launcher for %s", path, module)
                self._retire(launcher)
            else:
                launcher.last_used = time.monotonic()
                return launcher
        blocked = self._unavailable.get(module)
        if blocked is not None:
            if time.monotonic() - blocked.since < _RETRY_UNAVAILABLE_S and changed(blocked.files) is None:
                raise LauncherUnavailable(blocked.reason)
            del self._unavailable[module]
        task = self._starting.get(module)
        if task is None:
            task = asyncio.create_task(self._start(module), name=f"start-launcher-{module}")
            self._starting[module] = task
        return await asyncio.shield(task)

    async def _start(self, module: str) -> WarmLauncher:
        settings = replace(self._settings, learn=False) if module in self._no_learn else self._settings
        launcher = WarmLauncher(module, settings, self._launcher_died)
        try:
            await launcher.start()
        except LauncherUnavailable as err:
            log.warning("%s; its rollouts run in fresh interpreters for now", err)
            self._unavailable[module] = _Unavailable(str(err), time.monotonic(), launcher.files)
            raise
        finally:
            self._starting.pop(module, None)
        if module in self._died:
            self._died.discard(module)
            self._metrics.launcher_restarts.inc()
        if self._closed:
            await launcher.close(timeout_s=1.0)
            raise LauncherUnavailable("controller shutting down")
        self._live[module] = launcher
        self._metrics.launchers.set(len(self._live))
        return launcher

    def _launcher_died(self, launcher: WarmLauncher) -> None:
        if self._live.get(launcher.module) is launcher:
            del self._live[launcher.module]
            if not launcher.closing:
                self._died.add(launcher.module)
        self._retiring.discard(launcher)
        self._metrics.launchers.set(len(self._live))

    def released(self, launcher: WarmLauncher) -> None:
        """Called when one of the launcher's rollouts ended: a retired launcher with nothing left goes away."""
        launcher.last_used = time.monotonic()
        if launcher.active:
            return
        if launcher in self._retiring:
            self._retiring.discard(launcher)
            self._close_later(launcher)
        elif not self._closed:
            asyncio.get_running_loop().call_later(self._idle_s + 0.1, self._stop_idle)

    def refused(self, launcher: WarmLauncher, reason: str) -> None:
        """The launcher refused to fork (it became unsafe): replace it by one that preloads nothing it learned."""
        if self._live.get(launcher.module) is launcher:
            log.warning("launcher for %s refuses to fork (%s): replacing it", launcher.module, reason)
            self._no_learn.add(launcher.module)
            self._retire(launcher)

    def _retire(self, launcher: WarmLauncher) -> None:
        self._live.pop(launcher.module, None)
        launcher.closing = True
        self._metrics.launchers.set(len(self._live))
        if launcher.active == 0:
            self._close_later(launcher)
        else:
            self._retiring.add(launcher)

    def _close_later(self, launcher: WarmLauncher) -> None:
        task = asyncio.create_task(launcher.close(), name=f"close-launcher-{launcher.module}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _stop_idle(self) -> None:
        now = time.monotonic()
        for launcher in list(self._live.values()):
            if launcher.active == 0 and now - launcher.last_used > self._idle_s:
                log.info("launcher for %s idle for %.0f s: stopping it", launcher.module, now - launcher.last_used)
                self._retire(launcher)

    async def close(self, timeout_s: float = 1.0) -> None:
        """Stops every launcher; one still busy (importing) after timeout_s is killed, so shutdown stays prompt."""
        self._closed = True
        for task in list(self._starting.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        launchers = [*self._live.values(), *self._retiring]
        self._live.clear()
        self._retiring.clear()
        closing = (launcher.close(timeout_s) for launcher in launchers)
        await asyncio.gather(*closing, *self._closing, return_exceptions=True)
        self._metrics.launchers.set(0)
