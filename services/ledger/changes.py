"""A version counter that coroutines can wait on (used by the coalescing watches: models, proxy control)."""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    """`bump()` after a change; `await wait(seen)` returns once the version differs from `seen`."""

    def __init__(self) -> None:
        self.version = 0
        self._future: asyncio.Future[None] | None = None

    def bump(self) -> None:
        self.version += 1
        if self._future is not None and not self._future.done():
            self._future.set_result(None)
        self._future = None

    async def wait(self, seen: int, timeout: float | None = None) -> None:
        if self.version != seen:
            return
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._future), timeout)
