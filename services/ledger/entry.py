"""A stored rollout as the ledger holds it in memory: the rollout and the indexes its appends and reads use
(shared by the ledger and the append staging, so neither imports the other)."""

from __future__ import annotations

from services._gen.agl.v1 import rollout_pb2


class Entry:
    """One stored rollout plus its indexes. `rollout` is replaced, never mutated, when it changes."""

    __slots__ = (
        "event_bytes", "event_ids", "lsn", "next_seq", "ordinal", "past_attempts", "quota_logged", "rollout",
        "terminal_cursor",
    )  # fmt: skip

    def __init__(self, rollout: rollout_pb2.Rollout, ordinal: int, terminal_cursor: int | None = None) -> None:
        self.rollout = rollout
        self.ordinal = ordinal  # creation order, for paging
        self.terminal_cursor = terminal_cursor
        self.next_seq = 1  # so the rollout holds next_seq - 1 events
        self.event_bytes = 0  # bytes of its events as stored (quotas.py)
        self.quota_logged = False  # its first refusal over a limit is logged, not every one
        self.event_ids: dict[str, tuple[int, str]] | None = None  # event_id -> (sequence, attempt_id)
        self.lsn = 0  # store write of the last change
        # Attempts the rollout had before its current one (set while this ledger ran): late events may name them.
        self.past_attempts: set[str] | None = None
