"""Rollout change fan-out for WatchRollouts: a revision-indexed change ring plus per-subscriber bounded queues.

Every rollout change gets the next ledger revision and is published synchronously by the core: appended to
the ring (kept for resuming watchers) and offered to each subscriber whose filter it concerns. A ring may also
start from what a store kept (`restore`): the newest change of each object, so its revisions can have gaps.
A subscriber's queue is bounded; when it is full the subscriber is cut off (never the writer blocked): its next
read raises `ResourceExhausted` naming the last revision it was given, from which it can resume.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from services._gen.agl.v1 import rollout_pb2

from .errors import OutOfRange, ResourceExhausted


@dataclass(frozen=True, slots=True)
class Change:
    revision: int
    kind: int  # ledger_service_pb2.RolloutChangeType value (UPSERT or DELETE)
    rollout: rollout_pb2.Rollout  # never mutated after publication
    previous_state: int  # state before the change (UNSPECIFIED for a create)
    lsn: int  # store write carrying the change; sent to watchers once durable


class RolloutFilter:
    """States (empty: any) and exact-match labels (empty: any)."""

    __slots__ = ("labels", "states")

    def __init__(self, states: Iterable[int] = (), labels: Mapping[str, str] | None = None) -> None:
        self.states = frozenset(states)
        self.labels = dict(labels or {})

    def matches_labels(self, rollout: rollout_pb2.Rollout) -> bool:
        if not self.labels:
            return True
        have = rollout.metadata.labels
        return all(have.get(k) == v for k, v in self.labels.items())

    def matches(self, rollout: rollout_pb2.Rollout) -> bool:
        return (not self.states or rollout.status.state in self.states) and self.matches_labels(rollout)

    def concerns(self, change: Change) -> bool:
        """A change matters to a watcher when the rollout is, or was, in its filter."""
        if not self.matches_labels(change.rollout):
            return False
        if not self.states:
            return True
        return change.rollout.status.state in self.states or change.previous_state in self.states


class Subscriber:
    __slots__ = ("_cut", "_limit", "_queue", "_wakeup", "filter", "last_revision")

    def __init__(self, rollout_filter: RolloutFilter, limit: int) -> None:
        self.filter = rollout_filter
        self._limit = limit
        self._queue: collections.deque[Change] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._cut = False
        # Last revision handed to the consumer; 0 while it has not completed a snapshot.
        self.last_revision = 0

    def offer(self, change: Change) -> bool:
        """Queue a change; False (and the subscriber is cut) when the queue is full."""
        if self._cut:
            return False
        if len(self._queue) >= self._limit:
            self._cut = True
            self._queue.clear()
            self._wake()
            return False
        self._queue.append(change)
        self._wake()
        return True

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def next(self) -> Change:
        while True:
            if self._cut:
                raise ResourceExhausted(
                    f"watcher fell more than {self._limit} changes behind and was cut off; "
                    f"resume with after_revision={self.last_revision}"
                )
            if self._queue:
                return self._queue.popleft()
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None


class RolloutHub:
    def __init__(self, start_revision: int, ring_size: int, subscriber_limit: int) -> None:
        self._ring: collections.deque[Change] = collections.deque(maxlen=ring_size)
        # Every change with revision > floor is in the ring, or (after `restore`) a later change of the same object.
        self._floor = start_revision
        self._subscribers: set[Subscriber] = set()
        self._limit = subscriber_limit

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def subscribe(self, rollout_filter: RolloutFilter) -> Subscriber:
        sub = Subscriber(rollout_filter, self._limit)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def restore(self, floor: int, kept: Sequence[Change]) -> None:
        """Start the ring from what a store kept: `kept` in revision order, each the newest change of its object,
        and every object changed after `floor` in it. A watcher resuming after a restart is then given the
        present state of what changed after its revision, once, instead of having to start over."""
        self._ring.clear()
        self._floor = floor
        for change in kept:
            if change.revision > floor:
                self.publish(change)

    def publish(self, change: Change) -> None:
        ring = self._ring
        if ring.maxlen is not None and len(ring) == ring.maxlen:
            self._floor = ring[0].revision
        ring.append(change)
        cut: list[Subscriber] = []
        for sub in self._subscribers:
            if sub.filter.concerns(change) and not sub.offer(change):
                cut.append(sub)
        for sub in cut:
            self._subscribers.discard(sub)

    def changes_after(self, revision: int, current: int) -> list[Change]:
        """Kept changes with revision > `revision`; OutOfRange when some of them are no longer kept."""
        if revision > current:
            raise OutOfRange(f"revision {revision} is ahead of the ledger's revision {current}; start over")
        if revision < self._floor:
            raise OutOfRange(f"revision {revision} is no longer kept (oldest resumable is {self._floor}); start over")
        start = bisect.bisect_right(self._ring, revision, key=_revision)
        return list(itertools.islice(self._ring, start, None))


def _revision(change: Change) -> int:
    return change.revision
