"""The completion-ordered log of terminal rollouts.

Every rollout enters a terminal state exactly once and gets the next cursor. Deleting a rollout removes its
entry (cursors are never reused: the counter is persisted). Readers page through it from a cursor.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable


class TerminalLog:
    def __init__(self, last_cursor: int = 0) -> None:
        self.last_cursor = last_cursor
        # Parallel lists in cursor order; removed entries are tombstoned (id None) and compacted now and then.
        self._cursors: list[int] = []
        self._ids: list[str | None] = []
        self._index: dict[str, int] = {}  # rollout_id -> position in the lists
        self._tombstones = 0
        self._changed: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._index)

    def restore(self, cursor: int, rollout_id: str) -> None:
        """Re-add an entry read back from a store (call in cursor order)."""
        self._index[rollout_id] = len(self._cursors)
        self._cursors.append(cursor)
        self._ids.append(rollout_id)
        self.last_cursor = max(self.last_cursor, cursor)

    def next_cursor(self) -> int:
        return self.last_cursor + 1

    def append(self, rollout_id: str) -> int:
        self.last_cursor += 1
        self.restore(self.last_cursor, rollout_id)
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        return self.last_cursor

    def remove(self, rollout_id: str) -> None:
        pos = self._index.pop(rollout_id, None)
        if pos is None:
            return
        self._ids[pos] = None
        self._tombstones += 1
        if self._tombstones > 1024 and self._tombstones * 2 > len(self._ids):
            self._compact()

    def _compact(self) -> None:
        keep = [(c, i) for c, i in zip(self._cursors, self._ids, strict=True) if i is not None]
        self._cursors = [c for c, _ in keep]
        self._ids = [i for _, i in keep]
        self._index = {rid: pos for pos, (_, rid) in enumerate(keep) if rid is not None}
        self._tombstones = 0

    def read(self, after: int, limit: int, accept: Callable[[str], bool]) -> tuple[list[tuple[int, str]], int]:
        """Up to `limit` accepted entries with cursor > after, and the cursor reached (for the next call).

        The reached cursor moves past skipped (unaccepted) entries too, so a filtered reader never re-scans them.
        """
        out: list[tuple[int, str]] = []
        reached = after
        pos = bisect.bisect_right(self._cursors, after)
        cursors, ids = self._cursors, self._ids
        while pos < len(cursors) and len(out) < limit:
            rid = ids[pos]
            if rid is not None and accept(rid):
                out.append((cursors[pos], rid))
            reached = cursors[pos]
            pos += 1
        if pos >= len(cursors):
            reached = max(after, self.last_cursor)
        return out, reached

    async def wait_beyond(self, cursor: int) -> None:
        """Return once the log holds an entry past `cursor` (immediately if it already does)."""
        while self.last_cursor <= cursor:
            if self._changed is None or self._changed.done():
                self._changed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._changed)
