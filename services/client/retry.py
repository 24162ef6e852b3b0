"""The one retry policy of AGL's clients: the ledger client's unary calls and stream reconnects, and the proxy's
calls to its engines (services/proxy/engines/upstream.py, which adds what HTTP answers are retried)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter. attempts: tries in all, the first included."""

    attempts: int = 6
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def backoff(self, retry: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Sleep before retry number `retry` (1-based): uniform under a ceiling that doubles from initial_backoff_s
        up to max_backoff_s. A server's Retry-After raises it to at least that much, still under the cap."""
        ceiling = min(self.initial_backoff_s * self.multiplier ** max(retry - 1, 0), self.max_backoff_s)
        delay = (rng or random).uniform(0, ceiling)
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, self.max_backoff_s))
        return delay

    def delays(self) -> Iterator[float]:
        """Yields the sleep before each retry (attempts - 1 of them)."""
        for retry in range(1, max(self.attempts, 1)):
            yield self.backoff(retry)

    def reconnect_delay(self, failures: int) -> float:
        """Sleep before re-opening a stream after `failures` consecutive failures: at least half the ceiling, so
        a stream that keeps failing does not reconnect in a tight loop."""
        ceiling = min(self.initial_backoff_s * self.multiplier ** max(failures - 1, 0), self.max_backoff_s)
        return random.uniform(ceiling / 2, ceiling)


# For a long-running worker whose every ledger call must outlast a ledger restart (a kill -9 and compose's
# `restart: unless-stopped` took 3-6 s here; a pod rescheduled takes longer): ~35 s of backoff on average,
# 2 s apart at most, before a call gives up. The trainer's step would fail on the first call otherwise.
THROUGH_RESTARTS = RetryPolicy(attempts=40, initial_backoff_s=0.05, max_backoff_s=2.0)


def backoff_s(failures: int, initial_s: float = 1.0, ceiling_s: float = 30.0) -> float:
    """Seconds a background loop (a watch, a heartbeat) waits after `failures` consecutive failures: doubling
    from `initial_s`, capped at `ceiling_s`, no jitter (one such loop per process)."""
    return min(initial_s * 2 ** max(failures - 1, 0), ceiling_s)
