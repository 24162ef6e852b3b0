"""Repeated event ids: a repeat is a retry only if it is the same event, and that is decided the same way whether the
original is committed, still being committed, or earlier in the same request.

An agent chooses its event ids, so the answer to a repeat must not depend on timing or on which other appends
shared its request: one with other content is refused (ALREADY_EXISTS) to its sender, never taken as the original.
"""

from __future__ import annotations

import collections

from services._gen.agl.v1 import event_pb2

from .errors import AlreadyExists


def same_event(first: event_pb2.Event, event: event_pb2.Event, attempt_id: str) -> bool:
    """Whether `event` repeats `first`: what the ledger stamps (sequence, time) is not compared, and an empty
    attempt id stands for `attempt_id`, the attempt the ledger files the event under."""
    if first == event:
        return True
    copies = []
    for original in (first, event):
        copy = event_pb2.Event()
        copy.CopyFrom(original)
        copy.attempt_id = copy.attempt_id or attempt_id
        copy.sequence = 0
        copy.ClearField("create_time")
        copies.append(copy)
    return copies[0] == copies[1]


def check_repeat(first: event_pb2.Event, event: event_pb2.Event, attempt_id: str, where: str, index: int) -> None:
    """Raise AlreadyExists, for events[`index`] of a request, unless `event` repeats `first` (`where` says where
    `first` is: stored before, or earlier in the request)."""
    if not same_event(first, event, attempt_id):
        raise AlreadyExists(
            f"events[{index}]: event_id {event.event_id!r} of rollout {event.rollout_id} {where} with different "
            "content; a retry must repeat the event unchanged"
        )


class Uncommitted:
    """Events with an id handed to the store but not yet committed (a store that commits later, SQLite), so a
    repeat arriving meanwhile is compared with the original instead of being taken as it unread."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, int], tuple[int, event_pb2.Event]] = {}
        self._order: collections.deque[tuple[int, tuple[str, int]]] = collections.deque()

    def add(self, lsn: int, events: list[event_pb2.Event]) -> None:
        """`events` (sequence stamped) were written at `lsn`."""
        for event in events:
            key = (event.rollout_id, event.sequence)
            self._events[key] = (lsn, event)
            self._order.append((lsn, key))

    def get(self, rollout_id: str, sequence: int) -> event_pb2.Event | None:
        found = self._events.get((rollout_id, sequence))
        return None if found is None else found[1]

    def prune(self, committed_lsn: int) -> None:
        """Forgets what the store has committed (it can be read back from there)."""
        order, events = self._order, self._events
        while order and order[0][0] <= committed_lsn:
            lsn, key = order.popleft()
            found = events.get(key)
            if found is not None and found[0] == lsn:
                del events[key]
