"""Ctrl-C and SIGTERM for agl's long commands: they unwind as Interrupted, so every context manager stops what it
started, in synchronous code and inside an event loop alike."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    # Not an Exception, as KeyboardInterrupt is not: a library's `except Exception` (an import probing for an
    # optional package, seen in the tiny model's build) swallowed it, and a Ctrl-C there went unheard.
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_signals(received: list[int] | None = None) -> dict[int, Any]:
    """SIGINT and SIGTERM raise Interrupted; Ctrl-C works even where agl was started with SIGINT ignored (a shell's
    background job). Each signal is also appended to `received`, for code that runs libraries which may turn the
    raise into another error or swallow it (interrupted_by). The handlers they replace, to restore."""

    def handler(signum: int, frame: Any) -> None:
        if received is not None:
            received.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def interrupted_by(received: list[int], error: BaseException | None) -> Interrupted | None:
    """The interruption to report after a body ended with `error` (None: it returned) while signals were
    `received`: the raise lands wherever the main thread is, and an import it cuts short can surface as an
    ImportError from a later import, or be swallowed by a library's bare `except`."""
    if isinstance(error, Interrupted):
        return error
    return Interrupted(received[0]) if received else None


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
