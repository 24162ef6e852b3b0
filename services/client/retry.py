"""The retry policy of LedgerClient's unary calls and stream reconnects."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter."""

    attempts: int = 6
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def delays(self) -> Iterator[float]:
        """Yields the sleep before each retry (attempts - 1 of them)."""
        ceiling = self.initial_backoff_s
        for _ in range(max(self.attempts - 1, 0)):
            yield random.uniform(0, ceiling)
            ceiling = min(ceiling * self.multiplier, self.max_backoff_s)

    def reconnect_delay(self, failures: int) -> float:
        """Sleep before re-opening a stream after `failures` consecutive failures."""
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
