"""Upstream retry policy: which failures are retried and how long to wait (capped, jittered, exponential)."""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRYABLE_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # tries in all, the first included
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    @staticmethod
    def retryable_status(status: int) -> bool:
        """Transient engine answers: 408, 409, 429 and every 5xx."""
        return status in RETRYABLE_STATUSES or status >= 500

    def backoff(self, retry: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Sleep before retry number `retry` (1-based): full jitter under a capped exponential ceiling.

        A Retry-After from the engine raises the wait to at least that much, still under the cap.
        """
        ceiling = min(self.initial_backoff_s * self.multiplier ** max(retry - 1, 0), self.max_backoff_s)
        delay = (rng or random).uniform(0, ceiling)
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, self.max_backoff_s))
        return delay


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header in its delta-seconds form; None otherwise."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None
