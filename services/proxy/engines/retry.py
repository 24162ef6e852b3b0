"""Which engine answers the proxy retries, and a server's Retry-After; the waits are services.client's
RetryPolicy, the one policy of AGL's clients."""

from __future__ import annotations

RETRYABLE_STATUSES = frozenset({408, 409, 429})


def retryable_status(status: int) -> bool:
    """Transient engine answers: 408, 409, 429 and every 5xx."""
    return status in RETRYABLE_STATUSES or status >= 500


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header in its delta-seconds form; None otherwise."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None
