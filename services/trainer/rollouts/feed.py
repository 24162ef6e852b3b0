"""The run's terminal feed: one long-lived WatchTerminalRollouts stream kept in memory until consumed.

Entries arrive with their triplet-view events, so a finished rollout costs no extra round trip. The feed
resumes from the manager state: it restarts the stream before the oldest pending entry and, up to the
saved high-water cursor, accepts only entries that were pending; later entries are new.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from services._gen.agl.v1 import ledger_service_pb2
from services.client import LedgerClient
from services.trainer.rollouts.specs import LABEL_RUN
from services.trainer.rollouts.state import ManagerState

log = logging.getLogger(__name__)


class TerminalFeed:
    def __init__(
        self,
        client: LedgerClient,
        run_id: str,
        state: ManagerState,
        on_entry: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client
        self._run_id = run_id
        self._state = state
        self._on_entry = on_entry
        self.entries: dict[str, ledger_service_pb2.TerminalRollout] = {}
        self.changed = asyncio.Event()
        self.duplicates_skipped = 0
        self.received = 0
        self.dirty = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"agl-terminal-feed-{self._run_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("terminal feed for run %s had failed", self._run_id)
            self._task = None

    def check(self) -> None:
        """Raises the stream's error if it died (a non-resumable status such as UNAUTHENTICATED)."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error is not None:
                raise error
            raise ConnectionError("terminal stream ended")

    async def _run(self) -> None:
        state = self._state
        replay = set(state.pending)
        high_water = state.cursor
        after = state.resume_cursor()
        log.info("terminal feed for run %s starting after cursor %d (%d pending)", self._run_id, after, len(replay))
        stream = self._client.watch_terminal(after_cursor=after, labels={LABEL_RUN: self._run_id}, include_events=True)
        async with contextlib.aclosing(stream) as entries:
            async for entry in entries:
                rollout_id = entry.rollout.rollout_id
                if (entry.cursor <= high_water and rollout_id not in replay) or rollout_id in self.entries:
                    self.duplicates_skipped += 1
                    continue
                replay.discard(rollout_id)
                self.entries[rollout_id] = entry
                state.pending[rollout_id] = entry.cursor
                if entry.cursor > state.cursor:
                    state.cursor = entry.cursor
                self.received += 1
                self.dirty = True
                if self._on_entry is not None:
                    self._on_entry(rollout_id)
                self.changed.set()

    def take(self, rollout_ids: Iterable[str]) -> list[ledger_service_pb2.TerminalRollout]:
        """Removes and returns the entries of these rollouts (all must have arrived)."""
        taken = []
        for rollout_id in rollout_ids:
            taken.append(self.entries.pop(rollout_id))
            self._state.pending.pop(rollout_id, None)
        self.dirty = True
        return taken
