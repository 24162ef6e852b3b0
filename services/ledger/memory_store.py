"""Volatile store: event bodies as bytes in per-rollout lists; every write is "durable" immediately."""

from __future__ import annotations

from .store import DELETE_ROLLOUT, PUT_EVENT, Loaded, Op, Store


class MemoryStore(Store):
    def __init__(self) -> None:
        self._lsn = 0
        # rollout_id -> [(sequence, attempt_id, event_type, event_bytes, triplet_length)]; the triplet form is a
        # prefix of the event's bytes. Tuples of str/int/bytes are untracked by the garbage collector, so stored
        # events cost it nothing to walk.
        self._events: dict[str, list[tuple[int, str, str, bytes, int]]] = {}

    @property
    def committed_lsn(self) -> int:
        return self._lsn

    @property
    def description(self) -> str:
        return "memory"

    def load(self) -> Loaded:
        return Loaded()

    def write(self, ops: list[Op]) -> int:
        events = self._events
        for op in ops:
            kind = op[0]
            if kind == PUT_EVENT:
                rows = events.get(op[1])
                if rows is None:
                    rows = events[op[1]] = []
                rows.append((op[2], op[3], op[4], op[6], op[7]))
            elif kind == DELETE_ROLLOUT:
                events.pop(op[1], None)
        self._lsn += 1
        return self._lsn

    async def wait(self, lsn: int) -> None:
        return None

    def read_events(
        self,
        rollout_id: str,
        attempt_id: str | None,
        event_type: str | None,
        after_sequence: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        rows = self._events.get(rollout_id, ())
        out: list[tuple[int, bytes]] = []
        budget = -1 if max_bytes is None else max_bytes
        # Sequences are dense from 1 within a rollout's list, so the start is an index.
        for seq, attempt, etype, data, _cut in rows[after_sequence:] if after_sequence >= 0 else rows:
            if attempt_id is not None and attempt != attempt_id:
                continue
            if event_type is not None and etype != event_type:
                continue
            out.append((seq, data))
            if len(out) >= limit:
                break
            if budget >= 0:
                budget -= len(data)
                if budget < 0:
                    break
        return out

    def read_triplets(
        self, rollout_id: str, attempt_id: str | tuple[str, ...] | None, event_type: str | None
    ) -> list[tuple[int, str, bytes]]:
        attempts = (attempt_id,) if isinstance(attempt_id, str) else attempt_id
        return [
            (seq, etype, data[:cut])
            for seq, attempt, etype, data, cut in self._events.get(rollout_id, ())
            if cut and (attempts is None or attempt in attempts) and (event_type is None or etype == event_type)
        ]

    async def close(self) -> None:
        self._events.clear()
