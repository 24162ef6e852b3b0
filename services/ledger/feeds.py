"""What the ledger streams: rollout changes, the terminal feed, the model registry and the proxy control state.

Each feed is an async generator over the core. A feed starts with a consistent snapshot (taken in one
synchronous step together with its subscription, so nothing falls between them) and sends nothing before it
is durable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping

from services._gen.agl.v1 import ledger_service_pb2, model_pb2, proxy_control_pb2, rollout_pb2

from .entry import Entry
from .errors import InvalidArgument, OutOfRange
from .hub import RolloutFilter
from .ledger import Ledger
from .paging import page_size

SNAPSHOT = ledger_service_pb2.ROLLOUT_CHANGE_TYPE_SNAPSHOT
SYNCED = ledger_service_pb2.ROLLOUT_CHANGE_TYPE_SYNCED

TerminalItem = tuple[int, rollout_pb2.Rollout, list[bytes]]  # cursor, rollout, triplet events (serialized)
RolloutItem = tuple[int, int, rollout_pb2.Rollout | None]  # change type, revision, rollout
TERMINAL_READ_BATCH = 256


class _Counted:
    """Count a live stream of one kind while the context is open (for the subscribers gauge)."""

    def __init__(self, ledger: Ledger, kind: str) -> None:
        self._ledger, self._kind = ledger, kind

    def __enter__(self) -> None:
        self._ledger.stream_counts[self._kind] += 1

    def __exit__(self, *exc: object) -> None:
        self._ledger.stream_counts[self._kind] -= 1


async def watch_rollouts(
    ledger: Ledger, state_filter: Iterable[int], labels: Mapping[str, str], after_revision: int
) -> AsyncIterator[RolloutItem]:
    """Snapshot (or replay after `after_revision`), SYNCED, then live changes; each with its revision."""
    if after_revision < 0:
        raise InvalidArgument("after_revision must not be negative")
    rollout_filter = RolloutFilter(state_filter, labels)
    # Subscribing and taking the snapshot (or the replay) happen in one synchronous step.
    sub = ledger.hub.subscribe(rollout_filter)
    try:
        with _Counted(ledger, "rollouts"):
            synced = ledger.revision
            if after_revision == 0:
                snapshot = [e.rollout for e in ledger.rollouts.values() if rollout_filter.matches(e.rollout)]
                await ledger.durable(ledger.last_lsn)
                for rollout in snapshot:
                    yield SNAPSHOT, synced, rollout
            else:
                replay = [c for c in ledger.hub.changes_after(after_revision, synced) if rollout_filter.concerns(c)]
                sub.last_revision = after_revision
                for change in replay:
                    await ledger.durable(change.lsn)
                    sub.last_revision = change.revision
                    yield change.kind, change.revision, change.rollout
            sub.last_revision = synced
            yield SYNCED, synced, None
            while True:
                change = await sub.next()
                await ledger.durable(change.lsn)
                sub.last_revision = change.revision
                yield change.kind, change.revision, change.rollout
    finally:
        ledger.hub.unsubscribe(sub)


def _check_cursor(ledger: Ledger, after: int) -> None:
    if after < 0:
        raise InvalidArgument("after_cursor must not be negative")
    if after > ledger.terminal.last_cursor:
        raise OutOfRange(
            f"cursor {after} is ahead of the terminal log (last cursor {ledger.terminal.last_cursor}); start over"
        )


def _terminal_item(ledger: Ledger, cursor: int, entry: Entry, include_events: bool) -> TerminalItem:
    events: list[bytes] = []
    if include_events:
        rollout = entry.rollout
        attempt = rollout.status.attempt_id
        # Events filed under no attempt (posted with v1.0's attempt "0" before any controller claimed the rollout:
        # an evaluator's reward, a hook's note) are the rollout's and come before every attempt's, so the trainer
        # sees them with the attempt that ran; that attempt's own later reward still wins (it comes later).
        attempts = (attempt, "") if attempt else ""
        events = [data for _, data in ledger.triplet_events(rollout.rollout_id, attempts, None)]
    return cursor, entry.rollout, events


def _read_terminal(
    ledger: Ledger, after: int, labels: Mapping[str, str], limit: int
) -> tuple[list[tuple[int, Entry]], int]:
    rollout_filter = RolloutFilter((), labels)
    items, reached = ledger.terminal.read(
        after, limit, lambda rid: rollout_filter.matches_labels(ledger.rollouts[rid].rollout)
    )
    return [(cursor, ledger.rollouts[rid]) for cursor, rid in items], reached


async def list_terminal(
    ledger: Ledger, after: int, labels: Mapping[str, str], include_events: bool, size: int
) -> tuple[list[TerminalItem], int]:
    """One page of the terminal log after `after`, and the cursor to continue from."""
    _check_cursor(ledger, after)
    entries, reached = _read_terminal(ledger, after, labels, page_size(size, 100, 1000))
    await ledger.durable(max((e.lsn for _, e in entries), default=0))
    items: list[TerminalItem] = []
    budget = ledger.page_bytes  # a page is cut by bytes too (at least one item); it continues after the last one
    for cursor, entry in entries:
        item = _terminal_item(ledger, cursor, entry, include_events)
        budget -= item[1].ByteSize() + sum(len(data) + 8 for data in item[2]) + 16
        if budget < 0 and items:
            return items, items[-1][0]
        items.append(item)
    return items, reached


async def watch_terminal(
    ledger: Ledger, after: int, labels: Mapping[str, str], include_events: bool
) -> AsyncIterator[TerminalItem]:
    """Terminal rollouts in completion order from `after`, forever. Reads the log at the consumer's pace, so a slow
    consumer holds no buffer and never needs cutting off."""
    _check_cursor(ledger, after)
    with _Counted(ledger, "terminal"):
        position = after
        while True:
            entries, reached = _read_terminal(ledger, position, labels, TERMINAL_READ_BATCH)
            if entries:
                await ledger.durable(max(e.lsn for _, e in entries))
            for cursor, entry in entries:
                if ledger.rollouts.get(entry.rollout.rollout_id) is entry:  # not deleted meanwhile
                    yield _terminal_item(ledger, cursor, entry, include_events)
                position = cursor
            if not entries or len(entries) < TERMINAL_READ_BATCH:
                position = max(position, reached)
                await ledger.terminal.wait_beyond(position)


async def watch_models(ledger: Ledger, model_name: str) -> AsyncIterator[tuple[int, list[model_pb2.ModelEndpoint]]]:
    """The endpoint set now, then again after every change (coalesced: a slow reader gets the latest set)."""
    with _Counted(ledger, "models"):
        changes = ledger.models.changes
        while True:
            seen = changes.version
            endpoints = ledger.models.list(model_name)
            revision = ledger.models.revision
            await ledger.durable(ledger.last_lsn)
            yield revision, endpoints
            await changes.wait(seen)


async def watch_proxy_control(ledger: Ledger) -> AsyncIterator[proxy_control_pb2.ProxyControl]:
    """The control state now, then after every change, including replicas expiring (coalesced)."""
    with _Counted(ledger, "proxy_control"):
        changes = ledger.proxy.changes
        while True:
            seen = changes.version
            control = ledger.proxy.snapshot()
            if changes.version != seen:  # the snapshot expired a replica: take the settled state
                continue
            await ledger.durable(ledger.last_lsn)
            yield control
            while changes.version == seen:
                next_expiry = ledger.proxy.expire()
                if changes.version != seen:
                    break
                await changes.wait(seen, None if next_expiry is None else next_expiry + 0.01)
