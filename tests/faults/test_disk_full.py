"""The disk under the ledger's SQLite store fills up: writes fail with an error (never an acknowledged write that is
not stored), what was stored stays intact, and the ledger takes writes again once space returns.

The store lives on a small file system made for the test: a 16 MiB tmpfs where the test may mount one (root),
otherwise the ledger's file-size limit (RLIMIT_FSIZE, set on the running process) stands in for the full disk.

What the ledger does today: on the first failed commit its SQLite store fails stop (memory may hold staged writes
the file lacks), answers UNAVAILABLE and the process shuts down; a restart, once there is space, reloads the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, RetryPolicy
from tests.support.procs import ServiceProcess, start_ledger

from .figures import report

KEY = "fault-disk-key"
ROLLOUT = "ro-disk"


@contextlib.contextmanager
def small_disk(root: Path, way: str) -> Iterator[bool]:
    """root on a 16 MiB tmpfs (way "tmpfs", True when mounted), else a plain directory (False)."""
    root.mkdir()
    argv = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)]
    mounted = subprocess.run(argv if way == "tmpfs" else ["false"], capture_output=True)
    if way == "tmpfs" and mounted.returncode != 0:
        # Not a skip: CI runs as root on a machine that mounts tmpfs; a machine that cannot is a failure to see.
        pytest.fail(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); run as root", pytrace=False)
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(root)], check=False)


class Disk:
    """Fills and frees the store's file system (tmpfs: a filler file; otherwise: the ledger's file-size limit)."""

    def __init__(self, directory: Path, mounted: bool) -> None:
        self.directory, self.mounted = directory, mounted
        self.how = "a 16 MiB tmpfs filled up" if mounted else "RLIMIT_FSIZE on the ledger"

    def fill(self, ledger: ServiceProcess) -> None:
        if self.mounted:
            with open(self.directory / "filler", "wb") as filler, contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
        else:
            limit = max(p.stat().st_size for p in self.directory.glob("ledger.db*")) + 4096
            resource.prlimit(ledger.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))

    def free(self) -> None:
        if self.mounted:
            (self.directory / "filler").unlink()


def _event(index: int) -> event_pb2.Event:
    data = json.dumps({"i": index, "pad": "x" * 2000})
    return event_pb2.Event(rollout_id=ROLLOUT, attempt_id="at-1", event_type="note", data_json=data)


def _stored(events: list[event_pb2.Event]) -> list[int]:
    return [json.loads(e.data_json)["i"] for e in events if e.event_type == "note"]


async def _append(client: LedgerClient, start: int, count: int) -> tuple[list[int], str]:
    """Appends events one by one: (indexes acknowledged, the first error as 'CODE: details', or '')."""
    acknowledged = []
    for index in range(start, start + count):
        try:
            await client.append_events([_event(index)], timeout_s=10)
        except grpc.aio.AioRpcError as err:
            return acknowledged, f"{err.code().name}: {err.details()}"
        acknowledged.append(index)
    return acknowledged, ""


@dataclass
class Outcome:
    how: str
    acknowledged: list[int] = field(default_factory=list)
    error: str = ""
    ledger_log: str = ""
    stored_after_restart: list[int] = field(default_factory=list)
    written_after_restart: list[int] = field(default_factory=list)
    recovered_s: float = 0.0
    integrity: str = ""


def fill_the_disk(tmp_path: Path, way: str) -> Outcome:
    with small_disk(tmp_path / "disk", way) as mounted:
        directory = tmp_path / "disk"
        disk = Disk(directory, mounted)
        outcome = Outcome(disk.how)
        store = f"sqlite:{directory / 'ledger.db'}"
        with start_ledger(store=store, key=KEY) as ledger:

            async def until_refused() -> None:
                async with LedgerClient(ledger.address, KEY, retry=RetryPolicy(attempts=1)) as client:
                    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=ROLLOUT, input_json="{}")])
                    await client.update_status(ROLLOUT, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
                    before, error = await _append(client, 0, 50)
                    assert not error, error
                    disk.fill(ledger)
                    during, outcome.error = await _append(client, 50, 4000)
                    outcome.acknowledged = before + during

            asyncio.run(until_refused())
            deadline = time.monotonic() + 20
            while ledger.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            outcome.ledger_log = ledger.log_text()
        disk.free()
        freed = time.monotonic()
        with start_ledger(store=store, key=KEY) as again:

            async def after_restart() -> None:
                async with LedgerClient(again.address, KEY) as client:
                    outcome.stored_after_restart = _stored(await client.list_events(ROLLOUT))
                    outcome.written_after_restart, error = await _append(client, 10_000, 5)
                    assert not error, error

            asyncio.run(after_restart())
            outcome.recovered_s = time.monotonic() - freed
        outcome.integrity = sqlite3.connect(directory / "ledger.db").execute("PRAGMA integrity_check").fetchone()[0]
    return outcome


@pytest.mark.parametrize("way", ["tmpfs", "rlimit"])
def test_full_disk_refuses_writes_loses_nothing_acknowledged_and_recovers(tmp_path: Path, way: str) -> None:
    outcome = fill_the_disk(tmp_path, way)
    assert outcome.error.startswith("UNAVAILABLE"), outcome.error  # refused, not acknowledged
    assert "Traceback" not in outcome.ledger_log.split("failed; refusing further writes")[0]
    assert outcome.integrity == "ok"
    lost = sorted(set(outcome.acknowledged) - set(outcome.stored_after_restart))
    assert not lost, lost[:10]
    assert outcome.written_after_restart == list(range(10_000, 10_005))
    report(
        f"disk full under the SQLite store ({outcome.how})",
        f"{len(outcome.acknowledged)} events acknowledged, then refused with '{outcome.error[:100]}'; the ledger "
        f"stops; 0 acknowledged lost, integrity_check {outcome.integrity}; restarted and writing again "
        f"{outcome.recovered_s:.1f}s after space returned",
    )


def test_full_disk_error_names_the_full_disk(tmp_path: Path) -> None:
    outcome = fill_the_disk(tmp_path, "rlimit")
    failure = outcome.ledger_log.split("failed; refusing further writes:", 1)[-1].splitlines()[0]
    assert "full" in failure or "disk I/O" in failure, failure
