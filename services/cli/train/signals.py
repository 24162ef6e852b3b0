"""Ctrl-C and SIGTERM for agl's long commands: they unwind as Interrupted, so every context manager stops what it
started, in synchronous code and inside an event loop alike."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise Interrupted; Ctrl-C works even where agl was started with SIGINT ignored (a shell's
    background job). The handlers they replace, to restore."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    """Puts back the handlers raise_on_signals replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, where SIGINT and SIGTERM cancel the main task and Interrupted is raised once the loop has
    unwound. A handler's raise lands in whichever task the signal interrupts: a background task keeps it, so the
    interrupt is lost or its traceback printed at exit."""
    received: list[int] = []

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

        def on_signal(signum: int) -> None:
            received.append(signum)
            task.cancel()

        for sig in SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)  # it leaves the default handler, not the one there before
                signal.signal(sig, handler)

    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise
    if received:  # the signal came as the work ended: it still stops the command
        raise Interrupted(received[0])
    return result
