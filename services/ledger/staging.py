"""Stamping an append's new events: each gets its rollout's next sequence, its attempt, the time and its stored
form, and must fit its rollout's limits (quotas.py).

Guarantee: nothing of the rollouts changes unless every new event of the request fits. An event's stored size is
known only once it is stamped and serialized, so the request's next sequence and bytes per rollout, and the event
ids it adds, are worked out here first and applied to the rollouts only at the end; a refusal leaves them as they
were. An event whose id the rollout already holds (a retry) stores nothing: it gets its first sequence, at a limit
too.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services._gen.agl.v1 import event_pb2
from services.printable import printable

from . import attempts
from .quotas import EventQuotas
from .store import PUT_EVENT, Op
from .triplet import split

if TYPE_CHECKING:
    from .ledger import Entry

log = logging.getLogger(__name__)


@dataclass
class Staged:
    """What one append stores: the store's operations, and the answer (a sequence and attempt per event)."""

    sequences: list[int] = field(default_factory=list)
    attempt_ids: list[str] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    with_ids: list[event_pb2.Event] = field(default_factory=list)  # the new events that have an event_id


def stage(
    events: list[event_pb2.Event],
    rollouts: dict[str, Entry],
    quotas: EventQuotas,
    refusals: collections.Counter[str],
) -> Staged:
    """Stamp validated `events` (their rollouts exist) and advance their rollouts; raise QuotaExceeded, counted
    in `refusals` by limit, for the first one over a limit, with the rollouts unchanged."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    staged = Staged()
    heads: dict[str, list[int]] = {}  # rollout_id -> [next sequence, bytes held] with this request's events
    new_ids: dict[tuple[str, str], tuple[int, str]] = {}
    for i, event in enumerate(events):
        rollout_id = event.rollout_id
        entry = rollouts[rollout_id]
        event_id = event.event_id
        if event_id:
            known = entry.event_ids.get(event_id) if entry.event_ids is not None else None
            if known is None and new_ids:
                known = new_ids.get((rollout_id, event_id))
            if known is not None:
                staged.sequences.append(known[0])
                staged.attempt_ids.append(known[1])
                continue
        head = heads.get(rollout_id)
        if head is None:
            head = heads[rollout_id] = [entry.next_seq, entry.event_bytes]
        seq = head[0]
        attempt_id = event.attempt_id or entry.rollout.status.attempt_id or attempts.latest(entry.rollout.status)
        event.sequence = seq
        event.attempt_id = attempt_id
        event.create_time.seconds = seconds
        event.create_time.nanos = nanos
        data, cut = split(event.SerializeToString())
        refusal = quotas.refusal(i, rollout_id, seq, head[1], len(data))
        if refusal is not None:
            refusals[refusal.limit] += 1
            if not entry.quota_logged:  # an agent at its limit may go on trying: one line per rollout
                entry.quota_logged = True
                log.warning("rollout %s: append refused (%s); its further refusals are not logged", rollout_id,
                            printable(str(refusal)))  # fmt: skip
            raise refusal
        head[0] = seq + 1
        head[1] += len(data)
        staged.ops.append((PUT_EVENT, rollout_id, seq, attempt_id, event.event_type, event_id, data, cut))
        if event_id:
            new_ids[(rollout_id, event_id)] = (seq, attempt_id)
            staged.with_ids.append(event)
        staged.sequences.append(seq)
        staged.attempt_ids.append(attempt_id)
    for rollout_id, (next_seq, held) in heads.items():
        entry = rollouts[rollout_id]
        entry.next_seq = next_seq
        entry.event_bytes = held
    for (rollout_id, event_id), known in new_ids.items():
        entry = rollouts[rollout_id]
        if entry.event_ids is None:
            entry.event_ids = {}
        entry.event_ids[event_id] = known
    return staged
