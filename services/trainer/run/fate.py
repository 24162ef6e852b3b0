"""The processes of a trainer's own Ray cluster die with its driver, however the driver dies.

A driver that starts its Ray cluster (`ray.init()` with no cluster to join) runs the training loop in a Ray actor
(verl's task runner), not in itself. Killed with `kill -9 PID` (an operator, the OOM killer), the driver is gone
but the task runner is not: it went on collecting and consuming a step's rollouts after the kill, writing its
records, and Ray's per-node helpers (`ray::DashboardAgent`, ...) outlived the driver by more than a minute. A
trainer restarted meanwhile would share the run with a ghost.

So, before Ray starts, the driver marks its environment with a token every process of its cluster inherits, and
starts a watchdog holding one end of a pipe the driver keeps open. When the driver dies the pipe reads EOF and
the watchdog kills every process of the cluster (the task runner, workers, helpers, anything they started), then
exits. A driver that exits through the interpreter (a finished run, a health stop, Ctrl-C) first writes
ORDERLY down the pipe: Ray's shutdown is under way and what the watchdog still finds are its workers on their way
out, ended without a word. Without that word (kill -9, os._exit, a crash of the interpreter) the watchdog says in
one line how many processes of the dead driver's cluster it stopped.

A process of the cluster is one that carries the token, or a descendant of one. The token alone does not find
them all: Ray's helpers name themselves with setproctitle (`ray::DashboardAgent`), which writes the title over the
memory /proc/PID/environ reads, so their token is gone from view (two were found orphaned, tokenless, a minute
after a kill). Once their raylet is dead they are orphans, no one's descendants either, so the watchdog records
the cluster every RECORD_S while the driver lives and kills what it recorded too (a pid's start time guards
against a pid reused since).
Linux only (it reads /proc); elsewhere nothing is started. Clusters this driver only joins are not its own and are
never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path

TOKEN_VARIABLE = "AGL_TRAINER_FATE_TOKEN"
# Killing goes on until no process with the token has been seen for QUIET_S (a process a dying raylet was starting
# shows up after the first sweep), or for at most SWEEP_S in all. The watchdog, which has nothing else to do and
# is no part of the run, watches longer: a Ray helper was once seen alive 30 s after an interrupted driver's own
# sweep had ended.
QUIET_S = 1.0
SWEEP_S = 15.0
WATCHDOG_QUIET_S = 3.0
WATCHDOG_SWEEP_S = 30.0
# How often the watchdog records the cluster while the driver lives (a /proc scan: a few ms).
RECORD_S = 1.0
# What a driver exiting through the interpreter writes down the pipe (the trainer's driver, which imports no verl,
# is out before Ray's workers have left: they were reported as a dead driver's cluster, a second line of the
# trainer's after its health stop).
ORDERLY = b"orderly"
# What the watchdog keeps of the driver's environment: enough to import this module, nothing that names the run
# (so it is not taken for one of the run's processes while it watches).
WATCHDOG_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "HOME", "LANG", "LC_ALL", "TMPDIR")
# The driver's end of the pipe, open until the driver exits.
_HELD: list[int] = []


def processes_with(token: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids (but this one) whose environment carries `token` as the fate variable."""
    entry_bytes = b"\0" + f"{TOKEN_VARIABLE}={token}".encode() + b"\0"
    found = []
    for process in proc.iterdir():
        if not process.name.isdigit() or int(process.name) == os.getpid():
            continue
        try:
            environ = (process / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if entry_bytes in b"\0" + environ + b"\0":
            found.append(int(process.name))
    return found


def _parents_and_starts(proc: Path) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks) of every process readable now that has not died: a zombie
    (dead, waiting for its parent to reap it) cannot be killed again, and was once counted and swept as alive for
    the whole sweep when its parent had gone before reaping it."""
    table = {}
    for process in proc.iterdir():
        if not process.name.isdigit():
            continue
        try:
            fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] in ("Z", "X"):  # stat field 3: zombie, or dead
            continue
        table[int(process.name)] = (int(fields[1]), int(fields[19]))  # stat fields 4 (ppid) and 22 (starttime)
    return table


def cluster(token: str, proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> start time of every process (but this one) carrying the token, and of their descendants."""
    table = _parents_and_starts(proc)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    members = set(processes_with(token, proc))
    frontier = list(members)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in members:
                members.add(child)
                frontier.append(child)
    members.discard(os.getpid())
    return {pid: table[pid][1] for pid in members if pid in table}


def still_running(recorded: Mapping[int, int], proc: Path = Path("/proc")) -> dict[int, int]:
    """The recorded processes that still run (the same pid with the same start time)."""
    table = _parents_and_starts(proc)
    return {pid: start for pid, start in recorded.items() if pid in table and table[pid][1] == start}


def kill_all(
    token: str,
    quiet_s: float = QUIET_S,
    sweep_s: float = SWEEP_S,
    recorded: Mapping[int, int] | None = None,
    spare: Collection[int] = (),
) -> int:
    """SIGKILL to every process of the cluster (the token's, their descendants, and those `recorded` earlier that
    still run) but `spare`, until none has been seen for `quiet_s`; how many were killed."""
    killed: set[int] = set()
    started = last_seen = time.monotonic()
    while time.monotonic() - last_seen < quiet_s and time.monotonic() - started < sweep_s:
        pids = set(cluster(token)) | set(still_running(recorded or {}))
        pids -= {os.getpid(), *spare}
        if pids:
            last_seen = time.monotonic()
        # All frozen before any dies: a survivor that saw another die would act on it (the task runner recorded the
        # run failed with "actor unavailable" over an interrupted driver's own record).
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return len(killed)


def mark() -> str:
    """Puts the token in this process's environment (once), before Ray is imported: a Ray helper was found alive
    with no token, orphaned, after an interrupted driver's sweeps, as if started from an environment taken before
    share_fate set it. The watchdog starts only in share_fate."""
    token = os.environ.get(TOKEN_VARIABLE) or uuid.uuid4().hex
    os.environ[TOKEN_VARIABLE] = token
    return token


def kill_failed_start(watchdog: int | None) -> int:
    """Kills what a ray.init that failed left running (its GCS, its raylet: the driver's token, or children), the
    watchdog spared, so that the next try starts clean; 0 where the driver shares no fate."""
    token = os.environ.get(TOKEN_VARIABLE)
    if not token or not _HELD:
        return 0
    return kill_all(token, spare=() if watchdog is None else (watchdog,))


def kill_cluster() -> int:
    """Kills this driver's own cluster now (an interrupted driver); 0 where it shares no fate."""
    token = os.environ.get(TOKEN_VARIABLE)
    return kill_all(token) if token and _HELD else 0


def share_fate() -> subprocess.Popen[bytes] | None:
    """Marks this process's environment and starts the watchdog (see the module's docstring); None off Linux."""
    if not sys.platform.startswith("linux") or not Path("/proc/self/environ").exists():
        return None
    token = mark()
    read_end, write_end = os.pipe()
    # The watchdog itself does not carry the token (it must outlive the killing), and it keeps only the read end.
    env = {k: v for k, v in os.environ.items() if k in WATCHDOG_ENV}
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "services.trainer.run.fate", token, str(read_end)],
        pass_fds=(read_end,),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    os.close(read_end)
    # Held open for the driver's whole life: its closing (the driver's exit, any exit) is the signal; ORDERLY before
    # it says the exit is the interpreter's (atexit does not run on kill -9 or os._exit).
    os.set_inheritable(write_end, False)
    _HELD.append(write_end)
    atexit.register(_say_orderly, write_end)
    return watchdog


def _say_orderly(write_end: int) -> None:
    with contextlib.suppress(OSError):  # the watchdog gone already: nothing to tell
        os.write(write_end, ORDERLY)


def watch(token: str, read_fd: int) -> int:
    # Ctrl-C reaches the whole foreground group: the driver stops gracefully first, the watchdog waits for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    recorded: dict[int, int] = {}
    said = b""
    while True:
        readable, _, _ = select.select([read_fd], [], [], RECORD_S)
        if readable:
            data = os.read(read_fd, 4096)
            if not data:
                break  # EOF: the driver is gone
            said += data
        recorded = {**still_running(recorded), **cluster(token)}
    os.close(read_fd)
    killed = kill_all(token, WATCHDOG_QUIET_S, WATCHDOG_SWEEP_S, recorded)
    if killed and ORDERLY not in said:
        print(f"agl-trainer: the driver is gone; stopped {killed} process(es) of its Ray cluster", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1], int(sys.argv[2])))
