"""The moment each agent's code starts, told by the agent process itself on a datagram socket.

The controller keeps both ends of a socketpair; the sending end is handed to launchers and fresh agent
interpreters, whose agent process writes "LAUNCH_ID MONOTONIC_TIME" right before it calls run(). The time is
the agent's own clock reading (CLOCK_MONOTONIC is system-wide), so a busy controller loop does not inflate it.
A lost datagram only loses one latency sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)


class RunningNotices:
    def __init__(self) -> None:
        self._recv, self._send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._recv.setblocking(False)
        self._send.setblocking(False)
        self._waiting: dict[str, Callable[[float], None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def send_fd(self) -> int:
        """The fd to pass to an agent process (pass_fds)."""
        return self._send.fileno()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._recv.fileno(), self._drain)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._recv.fileno())
            self._loop = None
        self._recv.close()
        self._send.close()
        self._waiting.clear()

    def expect(self, launch_id: str, callback: Callable[[float], None]) -> None:
        """callback(monotonic time the agent's code started) once that launch's notice arrives."""
        self._waiting[launch_id] = callback

    def forget(self, launch_id: str) -> None:
        self._waiting.pop(launch_id, None)

    def _drain(self) -> None:
        while True:
            try:
                data = self._recv.recv(512)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("running notices: %s", err)
                return
            launch_id, _, when = data.decode(errors="replace").partition(" ")
            callback = self._waiting.pop(launch_id, None)
            if callback is not None:
                with contextlib.suppress(ValueError):
                    callback(float(when))
