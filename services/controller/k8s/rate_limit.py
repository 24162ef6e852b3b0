"""Token bucket that paces Job creation (--max-jobs-per-minute)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """`rate_per_s` tokens a second, at most `capacity` saved up; rate 0 means unlimited. Waiters are FIFO."""

    def __init__(self, rate_per_s: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate_per_s
        self._capacity = max(capacity, 1.0)
        self._tokens = self._capacity
        self._clock = clock
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def try_take(self) -> float:
        """Takes a token and returns 0, or returns the seconds until one is available."""
        if self._rate <= 0:
            return 0.0
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    async def take(self) -> None:
        async with self._lock:
            while (wait := self.try_take()) > 0:
                await asyncio.sleep(wait)
