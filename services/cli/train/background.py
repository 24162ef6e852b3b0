"""Runs that outlive the terminal: `agl train --detach` starts the same command in a session of its own, its output
in RUN/train.log, and returns at once; `agl logs RUN [-f]` reads (follows) that log, `agl stop RUN` stops the run as
Ctrl-C would (SIGTERM to its process group: the run is marked interrupted, its services stopped, and `--resume`
continues it), and `agl runs --local` lists the runs under agl-runs/ with their state and whether their process is
still alive. Which process runs a run is in its run.json (pid and the process's start time, so a reused pid is not
taken for it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from ..errors import FAILURE, USAGE, CliError
from .export import resolve_run
from .plan import RUN_FILE, read_run_file
from .process_id import alive, process_start
from .signals import Interrupted, raise_on_signals, restore_handlers

LOG_FILE = "train.log"
DETACHED_FILE = "detached.json"
DETACH_FLAG = "--detach"
# How long `agl stop` waits for the run to stop its services (the trainer's own stop, then the stack's).
STOP_WAIT_S = 180.0
FOLLOW_POLL_S = 0.5


def run_folder(run: str) -> Path:
    """A run id under agl-runs/ or a run's folder; it may not have a run.json yet (a detached run starting)."""
    return resolve_run(run, markers=(RUN_FILE, LOG_FILE))


def process_record(folder: Path) -> dict[str, object]:
    """What names the run's process: its run.json once written, before that the record detach() left."""
    record = read_run_file(folder)
    if record is not None and "pid" in record:
        return record
    try:
        started = json.loads((folder / DETACHED_FILE).read_text())
    except (OSError, ValueError):
        return record or {}
    return {**(record or {}), **started}


def detach(argv: Sequence[str], run_id: str, output: Path, out: TextIO) -> int:
    """Starts `agl train` with argv (without --detach, with the run's id) in a new session, its output in the run's
    log; the checks already passed here, so a refusal is not buried in the log."""
    argv = [arg for arg in argv if arg != DETACH_FLAG]
    if "--run-id" not in argv and not any(arg.startswith("--run-id=") for arg in argv):
        argv += ["--run-id", run_id]
    log_path = output / LOG_FILE
    with log_path.open("ab") as log, open(os.devnull, "rb") as nothing:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *argv],
            stdin=nothing, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # Python keeps SIGINT ignored in a child of a shell's background job: the run's own handlers install
            # theirs, and agl stop sends SIGTERM.
        )  # fmt: skip
    # Until the run writes its run.json, this is what says whether it still runs (agl logs -f on a run that died
    # while starting would otherwise wait for ever).
    (output / DETACHED_FILE).write_text(json.dumps({"pid": proc.pid, "pid_start": process_start(proc.pid)}) + "\n")
    out.write(
        f"run {run_id} started in the background (pid {proc.pid}); its output: {log_path}\n"
        f"  follow it: agl logs {run_id} -f    stop it: agl stop {run_id}    list runs: agl runs --local\n"
    )
    return 0


def _lines(path: Path, follow: bool, running: Callable[[], bool]) -> Iterator[str]:
    with path.open(errors="replace") as log:
        while True:
            line = log.readline()
            if line:
                yield line
                continue
            if not follow or not running():
                rest = log.read()
                if rest:
                    yield rest
                return
            time.sleep(FOLLOW_POLL_S)


def logs_command(run: str, follow: bool, out: TextIO = sys.stdout) -> int:
    folder = run_folder(run)
    path = folder / LOG_FILE
    if not path.is_file():
        raise CliError(f"run {folder.name} has no {LOG_FILE}: it was not started with --detach", USAGE)

    def running() -> bool:
        return alive(process_record(folder))

    # Ctrl-C and SIGTERM stop the following (handlers installed: a shell's background job starts with SIGINT ignored).
    previous = raise_on_signals()
    try:
        for line in _lines(path, follow, running):
            out.write(line)
            out.flush()
    except Interrupted as stop:  # the run goes on
        out.write(f"\nagl logs: stopped following by {stop}; run {folder.name} goes on (agl stop {folder.name})\n")
        return 128 + stop.signum
    finally:
        restore_handlers(previous)
    return 0


def stop_command(run: str, out: TextIO = sys.stdout) -> int:
    folder = run_folder(run)
    record = process_record(folder)
    if not alive(record):
        state = record.get("state", "not started")
        out.write(f"run {folder.name} is not running (state: {state})\n")
        return FAILURE
    pid = int(record["pid"])  # type: ignore[arg-type]
    try:
        os.killpg(os.getpgid(pid), signal.SIGTERM)
    except ProcessLookupError:
        out.write(f"run {folder.name} ended meanwhile\n")
        return 0
    deadline = time.monotonic() + STOP_WAIT_S
    previous = raise_on_signals()
    try:
        while alive(record) and time.monotonic() < deadline:
            time.sleep(FOLLOW_POLL_S)
    except Interrupted as stop:  # the run was told already: it stops without this command waiting
        out.write(f"\nagl stop: stopped waiting by {stop}; run {folder.name} is stopping (agl runs --local)\n")
        return 128 + stop.signum
    finally:
        restore_handlers(previous)
    if alive(record):
        log = folder / LOG_FILE
        out.write(f"run {folder.name} (pid {pid}) is still stopping after {STOP_WAIT_S:.0f}s; see {log}\n")
        return FAILURE
    after = read_run_file(folder) or {}
    out.write(
        f"run {folder.name} stopped after step {after.get('step', 0)} (state: {after.get('state')}); continue it: "
        f"agl train --run-id {folder.name} --resume (and the same options)\n"
    )
    return 0


def local_runs(runs_dir: Path) -> list[dict[str, object]]:
    """Every run folder under runs_dir: id, state ("running" only while its process is), last step, updated."""
    found = []
    for run_file in sorted(runs_dir.glob(f"*/{RUN_FILE}")):
        record = read_run_file(run_file.parent) or {}
        state = str(record.get("state", "?"))
        if state == "running" and not alive(record):
            state = "gone (its process ended without a word: killed?)"
        found.append({
            "run_id": record.get("run_id", run_file.parent.name),
            "state": state,
            "step": last_step(run_file.parent),
            "updated": record.get("updated", ""),
            "folder": str(run_file.parent),
        })  # fmt: skip
    return found


def last_step(folder: Path) -> int:
    metrics = folder / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]
    return max(steps, default=0)


def runs_command(out: TextIO = sys.stdout) -> int:
    from .options import RUNS_DIR

    runs = local_runs(RUNS_DIR)
    if not runs:
        out.write(f"no runs under {RUNS_DIR.resolve()}/\n")
        return 0
    width = max(len(str(r["run_id"])) for r in runs)
    out.write(f"{'RUN':<{width}}  {'STATE':<11}  {'STEP':>4}  UPDATED\n")
    for r in runs:
        out.write(f"{r['run_id']!s:<{width}}  {r['state']!s:<11}  {r['step']:>4}  {r['updated']}\n")
    return 0
