"""The store interface: where the ledger core persists what it changes.

The core keeps rollouts, indexes, counters and the terminal log in memory and hands every change to a store
as a list of operations (`write`), which the store applies atomically and in order. `write` returns a log
sequence number (LSN); `wait(lsn)` returns once that write is durable. Event bodies are owned by the store
(kept as serialized bytes, the triplet form first, see `triplet.split`) and read back with `read_events`
(whole) and `read_triplets` (the triplet forms). `load` returns what a durable store kept, so a restarted
ledger resumes where it stopped.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field

# Operations, as plain tuples (cheap to build on the hot path):
#   (PUT_ROLLOUT, rollout_id, ordinal, terminal_cursor | None, rollout_bytes)
#   (DELETE_ROLLOUT, rollout_id)                       -- removes its events too
#   (PUT_EVENT, rollout_id, sequence, attempt_id, event_type, event_id, event_bytes, triplet_length)
#                                                      -- event_bytes[:triplet_length] is the event's triplet form
#                                                         (triplet_length 0 outside the triplet view)
#   (PUT_MODEL, model_name, endpoint, endpoint_bytes)
#   (DELETE_MODEL, model_name, endpoint)
#   (PUT_META, key, value)                             -- value: int or bytes
#   (PUT_RUN, run_id, ordinal, run_bytes)
#   (DELETE_RUN, run_id)                               -- removes its steps too
#   (PUT_RUN_STEP, run_id, step, step_bytes)
PUT_ROLLOUT = 1
DELETE_ROLLOUT = 2
PUT_EVENT = 3
PUT_MODEL = 4
DELETE_MODEL = 5
PUT_META = 6
PUT_RUN = 7
DELETE_RUN = 8
PUT_RUN_STEP = 9

Op = tuple
MetaValue = int | bytes


@dataclass
class StoredRollout:
    rollout_id: str
    ordinal: int
    terminal_cursor: int | None
    data: bytes


@dataclass
class Loaded:
    """Everything a store kept, as `load` returns it (empty for a fresh or volatile store)."""

    rollouts: list[StoredRollout] = field(default_factory=list)  # in ordinal order
    # rollout_id -> highest stored event sequence.
    event_heads: dict[str, int] = field(default_factory=dict)
    # rollout_id -> bytes of its stored events (their event_bytes, summed), for the per-rollout limits.
    event_bytes: dict[str, int] = field(default_factory=dict)
    # (rollout_id, event_id, sequence, attempt_id) for every event stored with an event_id.
    event_ids: list[tuple[str, str, int, str]] = field(default_factory=list)
    models: list[bytes] = field(default_factory=list)
    meta: dict[str, MetaValue] = field(default_factory=dict)
    runs: list[tuple[int, bytes]] = field(default_factory=list)  # (ordinal, run_bytes) in ordinal order
    run_steps: list[bytes] = field(default_factory=list)


class Store(abc.ABC):
    """Persistence behind the ledger core. Every method is called from the event loop's thread."""

    #: Called as observer(seconds, operations) after each durable commit (metrics hook).
    commit_observer: Callable[[float, int], None] | None = None

    def commit_waiting_s(self) -> float:
        """Seconds the write being committed now has waited (0.0 when none is): how stuck the store is (health)."""
        return 0.0

    @property
    def failure(self) -> BaseException | None:
        """Why the store refuses every write from now on, or None while it works."""
        return None

    @property
    @abc.abstractmethod
    def committed_lsn(self) -> int:
        """The highest LSN that is durable."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Human-readable kind and location, for the startup log line."""

    @abc.abstractmethod
    def load(self) -> Loaded:
        """Read back what the store kept. Called once, before any write."""

    @abc.abstractmethod
    def write(self, ops: list[Op]) -> int:
        """Apply `ops` atomically after every earlier write; return the write's LSN.

        Raises `errors.Unavailable` when the store has failed.
        """

    @abc.abstractmethod
    async def wait(self, lsn: int) -> None:
        """Return once the write `lsn` (and every earlier one) is durable; raise `Unavailable` if it never will be."""

    @abc.abstractmethod
    def read_events(
        self,
        rollout_id: str,
        attempt_id: str | None,
        event_type: str | None,
        after_sequence: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        """(sequence, event_bytes) of durable events in sequence order; None filters match anything. At most `limit`
        rows; with `max_bytes`, reading also stops after the first row that takes the total past it."""

    @abc.abstractmethod
    def read_triplets(
        self, rollout_id: str, attempt_id: str | tuple[str, ...] | None, event_type: str | None
    ) -> list[tuple[int, str, bytes]]:
        """(sequence, event_type, triplet_bytes) of the durable events that have a triplet form, in sequence
        order; None filters match anything, a tuple of attempt ids matches any of them."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish pending writes and release resources."""
