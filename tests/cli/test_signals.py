"""agl's Ctrl-C and SIGTERM inside an event loop (services/cli/train/signals.py), in a child process: the signal is
sent from a background task, where a handler's raise would have been kept by that task and the interrupt lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, os, signal, sys
from services.cli.train.signals import Interrupted, raise_on_signals, run_async

async def background(stopped):
    try:
        os.kill(os.getpid(), signal.{sig})
        await asyncio.sleep(30)
    finally:
        stopped.append("background")

async def work(stopped):
    task = asyncio.ensure_future(background(stopped))
    try:
        await asyncio.sleep(30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stopped.append("work")

installed = raise_on_signals()
handler = signal.getsignal(signal.SIGTERM)
stopped = []
try:
    run_async(work(stopped))
except Interrupted as stop:
    assert signal.getsignal(signal.SIGTERM) is handler and signal.getsignal(signal.SIGINT) is handler
    print(stop.signum, ",".join(stopped))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_in_a_background_task_unwinds_the_loop_as_interrupted(sig: str) -> None:
    import signal

    script = SCRIPT.replace("{sig}", sig)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == f"{int(getattr(signal, sig))} background,work\n"
    assert result.stderr == ""


SWALLOWED = """
import io, os, signal, sys
from services.cli.train.session import run_interruptible

def swallowing():  # a library's bare except around an import, as the tiny model's build meets
    try:
        os.kill(os.getpid(), signal.{sig})
    except BaseException:
        pass
    return 0

def converting():  # an import cut short surfaces later as another error
    try:
        os.kill(os.getpid(), signal.{sig})
    except BaseException as err:
        raise ImportError("cannot import name 'x' from partially initialized module") from err
    return 0

for body in (swallowing, converting):
    out = io.StringIO()
    print(run_interruptible("train", body, out), out.getvalue().strip())
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_a_library_swallows_or_turns_into_another_error_still_stops_the_command(sig: str) -> None:
    import signal

    script = SWALLOWED.replace("{sig}", sig)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    line = f"{128 + int(getattr(signal, sig))} agl train: interrupted by {sig}; everything it started has been stopped"
    assert result.stdout.splitlines() == [line, line], result.stdout
