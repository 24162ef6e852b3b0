"""Durable store: SQLite in WAL mode with group commit.

A single writer thread drains every write queued while the previous transaction was committing and commits
them together in one transaction with `synchronous=FULL`, so one fsync covers many writes. A write's LSN is
reported durable (and the caller's request acknowledged) only after its transaction committed. Reads run on
a separate connection in the event loop's thread and see committed data only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .errors import Unavailable
from .store import (
    DELETE_MODEL,
    DELETE_ROLLOUT,
    DELETE_RUN,
    PUT_EVENT,
    PUT_META,
    PUT_MODEL,
    PUT_ROLLOUT,
    PUT_RUN,
    PUT_RUN_STEP,
    Loaded,
    Op,
    Store,
    StoredRollout,
)
from .triplet import split

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY,
    ordinal INTEGER NOT NULL,
    terminal_cursor INTEGER,
    data BLOB NOT NULL
);
-- The first triplet_length bytes of data are the event's triplet form (see triplet.split); 0: not in the view.
CREATE TABLE IF NOT EXISTS events (
    rollout_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    attempt_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    event_id TEXT,
    data BLOB NOT NULL,
    triplet_length INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_rollout ON events (rollout_id, seq);
CREATE TABLE IF NOT EXISTS models (
    model_name TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (model_name, endpoint)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, ordinal INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS run_steps (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, step)
);
"""

_SQL = {
    PUT_ROLLOUT: "INSERT OR REPLACE INTO rollouts (rollout_id, ordinal, terminal_cursor, data) VALUES (?, ?, ?, ?)",
    PUT_EVENT: "INSERT INTO events (rollout_id, seq, attempt_id, event_type, event_id, data, triplet_length) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)",
    PUT_MODEL: "INSERT OR REPLACE INTO models (model_name, endpoint, data) VALUES (?, ?, ?)",
    DELETE_MODEL: "DELETE FROM models WHERE model_name = ? AND endpoint = ?",
    PUT_META: "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
    PUT_RUN: "INSERT OR REPLACE INTO runs (run_id, ordinal, data) VALUES (?, ?, ?)",
    PUT_RUN_STEP: "INSERT OR REPLACE INTO run_steps (run_id, step, data) VALUES (?, ?, ?)",
}

# At most this many writes go into one transaction (bounds the latency of a single commit).
MAX_BATCH = 4096

# The writer's wait for another process's lock, per try. A locked file is not a failure: the writer tries the same
# transaction again until the lock is released (health says NOT_SERVING meanwhile), and a try this short lets a
# shutdown stop it within a second.
WRITER_BUSY_TIMEOUT_MS = 1000
# How often a write still waiting on the lock is logged again.
LOCKED_LOG_EVERY_S = 30.0
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def _connect(path: Path, *, busy_timeout_ms: int = 10000) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # Takes effect only when the file is created. A ~3 KB event fills most of a 4 KiB page, and WAL writes one
    # frame (one write call) per page; 16 KiB pages cut the writer thread's CPU per event by about a fifth.
    conn.execute("PRAGMA page_size=16384")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    return conn


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """The file is locked by another connection (SQLITE_BUSY / SQLITE_LOCKED, extended codes included)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is None:
        return "database is locked" in str(exc) or "database table is locked" in str(exc)
    return code & 0xFF in _BUSY_CODES


class SqliteStore(Store):
    def __init__(self, path: str | Path, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._on_failure = on_failure
        self._reader = _connect(self._path)
        self._reader.executescript(SCHEMA)
        _add_triplets(self._reader)
        self._queue: queue.SimpleQueue[tuple[int, list[Op]] | None] = queue.SimpleQueue()
        self._next_lsn = 0
        self._committed = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed: BaseException | None = None
        self._commit_started = 0.0  # monotonic time the writer thread began its current commit; 0.0: idle
        self._closing = False  # set by close(): a write waiting on another process's lock stops trying
        self._thread = threading.Thread(target=self._writer, name="ledger-sqlite-writer", daemon=True)
        self._thread.start()

    @property
    def committed_lsn(self) -> int:
        return self._committed

    @property
    def description(self) -> str:
        return f"sqlite:{self._path}"

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def commit_waiting_s(self) -> float:
        started = self._commit_started
        return time.monotonic() - started if started else 0.0

    def load(self) -> Loaded:
        loaded = Loaded()
        cur = self._reader.execute("SELECT rollout_id, ordinal, terminal_cursor, data FROM rollouts ORDER BY ordinal")
        loaded.rollouts = [StoredRollout(*row) for row in cur]
        # length() of a blob column reads no overflow pages: the sizes cost a scan of the rows, not of the data.
        cur = self._reader.execute("SELECT rollout_id, MAX(seq), SUM(LENGTH(data)) FROM events GROUP BY rollout_id")
        for rollout_id, head, size in cur:
            loaded.event_heads[rollout_id] = head
            loaded.event_bytes[rollout_id] = size
        cur = self._reader.execute(
            "SELECT rollout_id, event_id, seq, attempt_id FROM events WHERE event_id IS NOT NULL ORDER BY rowid"
        )
        loaded.event_ids = cur.fetchall()
        loaded.models = [row[0] for row in self._reader.execute("SELECT data FROM models")]
        loaded.meta = dict(self._reader.execute("SELECT key, value FROM meta").fetchall())
        loaded.runs = self._reader.execute("SELECT ordinal, data FROM runs ORDER BY ordinal").fetchall()
        loaded.run_steps = [row[0] for row in self._reader.execute("SELECT data FROM run_steps ORDER BY run_id, step")]
        return loaded

    def write(self, ops: list[Op]) -> int:
        if self._failed is not None:
            raise Unavailable(f"the ledger store failed: {self._failed}")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._next_lsn += 1
        self._queue.put((self._next_lsn, ops))
        return self._next_lsn

    async def wait(self, lsn: int) -> None:
        if lsn <= self._committed:
            return
        if self._failed is not None:
            raise Unavailable(f"the ledger store failed: {self._failed}")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((lsn, fut))
        await fut

    def read_events(
        self,
        rollout_id: str,
        attempt_id: str | None,
        event_type: str | None,
        after_sequence: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        sql = "SELECT seq, data FROM events WHERE rollout_id = ? AND seq > ?"
        args: list[object] = [rollout_id, after_sequence]
        sql, args = _filtered(sql, args, attempt_id, event_type)
        sql += " ORDER BY seq LIMIT ?"
        args.append(limit)
        cursor = self._reader.execute(sql, args)
        if max_bytes is None:
            return cursor.fetchall()
        out: list[tuple[int, bytes]] = []
        for row in cursor:  # rows are read one at a time, so large events past the budget are never loaded
            out.append(row)
            max_bytes -= len(row[1])
            if max_bytes < 0:
                break
        cursor.close()
        return out

    def read_triplets(
        self, rollout_id: str, attempt_id: str | tuple[str, ...] | None, event_type: str | None
    ) -> list[tuple[int, str, bytes]]:
        sql = "SELECT seq, event_type, substr(data, 1, triplet_length) FROM events WHERE rollout_id = ?"
        sql, args = _filtered(sql + " AND triplet_length > 0", [rollout_id], attempt_id, event_type)
        return self._reader.execute(sql + " ORDER BY seq", args).fetchall()

    async def close(self) -> None:
        self._closing = True
        if self._thread.is_alive():
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join)
        # Resolve waiters of the last batch (its callback may not have run before the loop is torn down).
        self._committed_up_to(self._next_lsn if self._failed is None else self._committed)
        self._reader.close()

    # -- writer thread -------------------------------------------------------------------------------------------

    def _writer(self) -> None:
        conn = _connect(self._path, busy_timeout_ms=WRITER_BUSY_TIMEOUT_MS)
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    break
                batch = [item]
                stop = False
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batch.append(more)
                self._commit_until_done(conn, batch)
                if stop:
                    break
        except BaseException as exc:
            log.critical("sqlite store %s failed; refusing further writes: %s", self._path, exc)
            self._failed = exc
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._fail_waiters, exc)
        finally:
            conn.close()

    def _commit_until_done(self, conn: sqlite3.Connection, batch: list[tuple[int, list[Op]]]) -> None:
        """Commit `batch`, trying again for as long as another process holds the file's lock (not acknowledged
        meanwhile); any other error, or a lock still held when the store closes, fails the store."""
        self._commit_started = time.monotonic()
        logged_at = 0.0
        try:
            while True:
                try:
                    self._commit(conn, batch)
                    break
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise
                    waited = time.monotonic() - self._commit_started
                    if self._closing:
                        raise Unavailable(
                            f"the file was still locked by another process at shutdown ({len(batch)} writes waited "
                            f"{waited:.1f}s, not committed)"
                        ) from exc
                    if not logged_at or time.monotonic() - logged_at >= LOCKED_LOG_EVERY_S:
                        logged_at = time.monotonic()
                        log.warning(
                            "sqlite store %s is locked by another process: %d writes have waited %.1fs; trying "
                            "again until the lock is released (%s)", self._path, len(batch), waited, exc,
                        )  # fmt: skip
            if logged_at:
                log.info(
                    "sqlite store %s: the lock was released, %d writes committed after %.1fs",
                    self._path, len(batch), time.monotonic() - self._commit_started,
                )  # fmt: skip
        finally:
            self._commit_started = 0.0

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[int, list[Op]]]) -> None:
        started = time.perf_counter()
        conn.execute("BEGIN")
        try:
            ops = [op for _lsn, item_ops in batch for op in item_ops]
            n_ops = len(ops)
            _apply(conn, ops)
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (a full disk does): a second ROLLBACK would raise "no
            # transaction is active" and hide the real error.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        elapsed = time.perf_counter() - started
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # RuntimeError: the loop closed between the check and the call (shutdown).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_commit, batch[-1][0], elapsed, n_ops)

    # -- event loop thread ---------------------------------------------------------------------------------------

    def _on_commit(self, lsn: int, elapsed: float, n_ops: int) -> None:
        self._committed_up_to(lsn)
        if self.commit_observer is not None:
            self.commit_observer(elapsed, n_ops)

    def _committed_up_to(self, lsn: int) -> None:
        if lsn > self._committed:
            self._committed = lsn
        waiters = self._waiters
        while waiters and waiters[0][0] <= self._committed:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_result(None)

    def _fail_waiters(self, exc: BaseException) -> None:
        # Told first, so health says NOT_SERVING before any caller hears that its write failed.
        if self._on_failure is not None:
            self._on_failure(exc)
        while self._waiters:
            fut = self._waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(Unavailable(f"the ledger store failed: {exc}"))


def _apply(conn: sqlite3.Connection, ops: list[Op]) -> None:
    """Run ops in order, grouping runs of the same kind into one executemany."""
    i, n = 0, len(ops)
    while i < n:
        kind = ops[i][0]
        j = i + 1
        while j < n and ops[j][0] == kind:
            j += 1
        rows = [op[1:] for op in ops[i:j]]
        if kind == DELETE_ROLLOUT:
            conn.executemany("DELETE FROM events WHERE rollout_id = ?", rows)
            conn.executemany("DELETE FROM rollouts WHERE rollout_id = ?", rows)
        elif kind == DELETE_RUN:
            conn.executemany("DELETE FROM run_steps WHERE run_id = ?", rows)
            conn.executemany("DELETE FROM runs WHERE run_id = ?", rows)
        elif kind == PUT_EVENT:
            conn.executemany(_SQL[PUT_EVENT], [(r[0], r[1], r[2], r[3], r[4] or None, r[5], r[6]) for r in rows])
        else:
            conn.executemany(_SQL[kind], rows)
        i = j


def _filtered(
    sql: str, args: list[object], attempt_id: str | tuple[str, ...] | None, event_type: str | None
) -> tuple[str, list[object]]:
    if isinstance(attempt_id, tuple):
        sql += f" AND attempt_id IN ({', '.join('?' * len(attempt_id))})"
        args.extend(attempt_id)
    elif attempt_id is not None:
        sql += " AND attempt_id = ?"
        args.append(attempt_id)
    if event_type is not None:
        sql += " AND event_type = ?"
        args.append(event_type)
    return sql, args


def _add_triplets(conn: sqlite3.Connection) -> None:
    """Bring a file written before events were stored with their triplet form first up to date (once, at open)."""
    if "triplet_length" in [row[1] for row in conn.execute("PRAGMA table_info(events)")]:
        return
    conn.execute("BEGIN")
    try:
        conn.execute("ALTER TABLE events ADD COLUMN triplet_length INTEGER NOT NULL DEFAULT 0")
        rows = conn.execute("SELECT rowid, data FROM events").fetchall()
        updates = [(*split(d), r) for r, d in rows]
        conn.executemany("UPDATE events SET data = ?, triplet_length = ? WHERE rowid = ?", updates)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    log.info("sqlite store: stored %d events again with their triplet form first", len(rows))
