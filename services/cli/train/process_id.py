"""Which process runs a run, recorded so that another command can tell whether it still does: its pid and its
start time (a pid is reused once its process has ended; the pair is not)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if there is no such
    process, or only its exit status waiting for its parent (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces and parentheses
    return None if fields[0] == "Z" else fields[19]


def this_process() -> dict[str, object]:
    """What run.json records of the process running the run."""
    return {"pid": os.getpid(), "pid_start": process_start(os.getpid())}


def alive(record: Mapping[str, object]) -> bool:
    """Whether the process a run.json names still runs (the same process: its start time matches)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = process_start(pid)
    return start is not None and start == record.get("pid_start")
