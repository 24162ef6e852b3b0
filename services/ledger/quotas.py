"""Per-rollout limits on what the ledger stores: how many events, how many bytes of them, and how large one may be.

A rollout is one agent's run (its token opens nothing else), so these bound what one agent can make the ledger
keep, in memory and on disk alike. A rollout's events of every attempt count together: the bound is then one per
stored rollout whatever its retries, the event count is the rollout's own sequence (dense from 1 in every store,
so it survives a restart with no bookkeeping), and deleting the rollout frees what it held. Bytes are the events
as stored (what the ledger's stamps add included), so a restart recounts them exactly from the store.

An append over a limit stores nothing of its request (appends are atomic) and is refused with QuotaExceeded
(RESOURCE_EXHAUSTED), naming the event, the rollout, the limit and the setting that sets it. A repeat of an event
already stored stores nothing and is answered as before, at the limit too, so a sender's retries stay safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import QuotaExceeded

MIB = 1024 * 1024

# The limits, as the refusals' `limit` and the metrics' label values.
ROLLOUT_EVENTS = "rollout_events"
ROLLOUT_BYTES = "rollout_bytes"
EVENT_BYTES = "event_bytes"
LIMITS = (ROLLOUT_EVENTS, ROLLOUT_BYTES, EVENT_BYTES)

# (flag, environment variable) of each limit's setting (config.py declares them with these names).
SETTING_NAMES = {
    ROLLOUT_EVENTS: ("--max-rollout-events", "AGL_LEDGER_MAX_ROLLOUT_EVENTS"),
    ROLLOUT_BYTES: ("--max-rollout-mb", "AGL_LEDGER_MAX_ROLLOUT_MB"),
    EVENT_BYTES: ("--max-event-mb", "AGL_LEDGER_MAX_EVENT_MB"),
}

_NOTHING_STORED = "nothing of this request was stored"


def _setting(limit: str) -> str:
    flag, env = SETTING_NAMES[limit]
    return f"the ledger's {flag}, {env}"


@dataclass(frozen=True)
class EventQuotas:
    max_rollout_events: int = 10_000
    max_rollout_bytes: int = 256 * MIB
    max_event_bytes: int = 32 * MIB

    def refusal(self, index: int, rollout_id: str, sequence: int, stored_bytes: int, size: int) -> QuotaExceeded | None:
        """Why events[`index`] may not be stored, or None: it would be the rollout's event `sequence`, is `size`
        bytes as stored, and the rollout holds `stored_bytes` (this request's earlier events included). Cheap when
        it fits: the refusal's text is made only for a refusal."""
        if size > self.max_event_bytes:
            return QuotaExceeded(
                EVENT_BYTES,
                f"{_where(index, rollout_id)}: the event is {size:,} bytes, over the limit of "
                f"{_mib(self.max_event_bytes)} for one event ({_setting(EVENT_BYTES)}); {_NOTHING_STORED}",
            )
        if sequence > self.max_rollout_events:
            return QuotaExceeded(
                ROLLOUT_EVENTS,
                f"{_where(index, rollout_id)}: rollout {rollout_id} holds {sequence - 1:,} events, its limit of "
                f"{self.max_rollout_events:,} events per rollout ({_setting(ROLLOUT_EVENTS)}); {_NOTHING_STORED}",
            )
        if stored_bytes + size > self.max_rollout_bytes:
            return QuotaExceeded(
                ROLLOUT_BYTES,
                f"{_where(index, rollout_id)}: rollout {rollout_id} holds {stored_bytes:,} bytes of events and this "
                f"one ({size:,} bytes) would take it past its limit of {_mib(self.max_rollout_bytes)} per rollout "
                f"({_setting(ROLLOUT_BYTES)}); {_NOTHING_STORED}",
            )
        return None


def _where(index: int, rollout_id: str) -> str:
    return f"events[{index}] (rollout {rollout_id})"


def _mib(size: int) -> str:
    return f"{size // MIB:,} MiB" if size % MIB == 0 else f"{size:,} bytes"
