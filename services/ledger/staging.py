"""Stamping an append's new events: each gets its rollout's next sequence, its attempt, the time and its stored
form, and must fit its rollout's limits (quotas.py).

Guarantee: nothing of the rollouts changes unless every new event of the request fits. An event's stored size is
known only once it is stamped and serialized, so each event advances its rollout as it is staged (no bookkeeping
on the way, for the usual one-event request) and a refusal takes back what the request's earlier events did before
it is raised. An event whose id the rollout already holds (a retry, or a repeat earlier in the
request) stores nothing: it gets its first sequence, at a limit too.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import NamedTuple

from services._gen.agl.v1 import event_pb2
from services.printable import printable

from . import attempts
from .entry import Entry
from .quotas import EventQuotas
from .store import PUT_EVENT, Op
from .triplet import split

log = logging.getLogger(__name__)


class Staged(NamedTuple):
    """What one append stores: the store's operations, and the answer (a sequence and attempt per event)."""

    sequences: list[int]
    attempt_ids: list[str]
    ops: list[Op]
    with_ids: list[event_pb2.Event]  # the new events that have an event_id


def stage(
    events: list[event_pb2.Event],
    rollouts: dict[str, Entry],
    quotas: EventQuotas | None,
    refusals: collections.Counter[str],
) -> Staged:
    """Stamp validated `events` (their rollouts exist) and advance their rollouts; raise QuotaExceeded, counted
    in `refusals` by limit, for the first one over a limit, with the rollouts as they were. Without `quotas`
    nothing is refused (the events are counted all the same)."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    sequences: list[int] = []
    attempt_ids: list[str] = []
    ops: list[Op] = []
    with_ids: list[event_pb2.Event] = []
    for i, event in enumerate(events):
        rollout_id = event.rollout_id
        entry = rollouts[rollout_id]
        event_id = event.event_id
        if event_id and entry.event_ids is not None:
            known = entry.event_ids.get(event_id)  # stored before, or earlier in this request
            if known is not None:
                sequences.append(known[0])
                attempt_ids.append(known[1])
                continue
        attempt_id = event.attempt_id or entry.rollout.status.attempt_id or attempts.latest(entry.rollout.status)
        seq = entry.next_seq
        event.sequence = seq
        event.attempt_id = attempt_id
        event.create_time.seconds = seconds
        event.create_time.nanos = nanos
        data, cut = split(event.SerializeToString())
        size = len(data)
        refusal = None if quotas is None else quotas.refusal(i, rollout_id, seq, entry.event_bytes, size)
        if refusal is not None:
            _undo(ops, rollouts)
            refusals[refusal.limit] += 1
            if not entry.quota_logged:  # an agent at its limit may go on trying: one line per rollout
                entry.quota_logged = True
                log.warning("rollout %s: append refused (%s); its further refusals are not logged", rollout_id,
                            printable(str(refusal)))  # fmt: skip
            raise refusal
        entry.next_seq = seq + 1
        entry.event_bytes += size
        ops.append((PUT_EVENT, rollout_id, seq, attempt_id, event.event_type, event_id, data, cut))
        if event_id:
            if entry.event_ids is None:
                entry.event_ids = {}
            entry.event_ids[event_id] = (seq, attempt_id)
            with_ids.append(event)
        sequences.append(seq)
        attempt_ids.append(attempt_id)
    return Staged(sequences, attempt_ids, ops, with_ids)


def _undo(ops: list[Op], rollouts: dict[str, Entry]) -> None:
    """Take back what the staged `ops` (PUT_EVENTs of one request, not yet written) did to their rollouts."""
    for _kind, rollout_id, seq, _attempt, _type, event_id, data, _cut in reversed(ops):
        entry = rollouts[rollout_id]
        entry.next_seq = seq
        entry.event_bytes -= len(data)
        if event_id and entry.event_ids is not None:
            entry.event_ids.pop(event_id, None)
