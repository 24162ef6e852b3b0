"""agl runs --local, agl logs and agl stop on run folders as agl train leaves them, with a process of our own
standing in for the run's (a real detached run, stopped and resumed: test_train.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from services.cli.train.process_id import process_start

CHECKOUT = Path(__file__).resolve().parents[2]


def agl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def run_folder(root: Path, run_id: str, state: str, pid: int | None = None, steps: int = 0) -> Path:
    folder = root / "agl-runs" / run_id
    folder.mkdir(parents=True)
    record = {"run_id": run_id, "state": state, "updated": "2026-12-05T19:00:00+0000"}
    if pid is not None:
        record |= {"pid": pid, "pid_start": process_start(pid)}
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(steps + 1)))
    return folder


def test_runs_are_listed_with_their_state_and_a_vanished_process_is_named(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_folder(tmp_path, "alive", "running", sleeper.pid, steps=2)
        dead = subprocess.Popen(["true"])
        dead.wait()
        run_folder(tmp_path, "killed", "running", dead.pid, steps=1)
        run_folder(tmp_path, "done", "succeeded", steps=3)
        listed = agl("runs", "--local", cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert re.search(r"^alive\s+running\s+2\s", listed.stdout, re.MULTILINE), listed.stdout
        assert re.search(r"^killed\s+gone \(its process ended without a word: killed\?\)\s+1", listed.stdout, re.M)
        assert re.search(r"^done\s+succeeded\s+3\s", listed.stdout, re.MULTILINE), listed.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stop_signals_the_runs_process_group_and_waits_for_it(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    folder = run_folder(tmp_path, "r1", "running", sleeper.pid)
    (folder / "train.log").write_text("step   1/3  reward 0.25\n")
    follow = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "logs", "r1", "-f"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
    )  # fmt: skip
    assert follow.stdout is not None and follow.stdout.readline() == "step   1/3  reward 0.25\n"
    stopped = agl("stop", "r1", cwd=tmp_path)
    sleeper.wait(timeout=10)
    assert sleeper.returncode == -signal.SIGTERM
    assert stopped.returncode == 0 and "run r1 stopped after step 0 (state: running)" in stopped.stdout
    rest, _ = follow.communicate(timeout=30)  # -f ends once the run's process has
    assert follow.returncode == 0 and rest == ""
    again = agl("stop", "r1", cwd=tmp_path)
    assert again.returncode == 1 and "run r1 is not running (state: running)" in again.stdout
    assert agl("logs", "r1", cwd=tmp_path).stdout == "step   1/3  reward 0.25\n"


def test_what_these_commands_cannot_do_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run_folder(tmp_path, "fg", "succeeded")
    cases = [
        (["logs", "nosuch"], "no run 'nosuch': neither a run folder nor a run under agl-runs/"),
        (["stop", "nosuch"], "no run 'nosuch'"),
        (["logs", "fg"], "run fg has no train.log: it was not started with --detach"),
        (["runs", "--local", "--json"], "--local lists the run folders under agl-runs/: it takes none of"),
    ]
    for argv, expected in cases:
        done = agl(*argv, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.startswith("agl: ") and expected in done.stderr, (argv, done)
    from services.api import AglError, train

    try:
        train(data="t.jsonl", detach=True)
    except AglError as err:
        assert err.code == 2 and "from Python, call train() in a thread or process of your own" in str(err)
    else:
        raise AssertionError("train(detach=True) was accepted")


def test_a_run_that_died_before_its_run_json_is_not_followed_for_ever(tmp_path: Path) -> None:
    """detach() leaves the child's pid; a child that died while starting (no run.json) ends `logs -f` at once."""
    dead = subprocess.Popen(["true"])
    start = process_start(dead.pid)
    dead.wait()
    folder = tmp_path / "agl-runs" / "early"
    folder.mkdir(parents=True)
    (folder / "detached.json").write_text(json.dumps({"pid": dead.pid, "pid_start": start}))
    (folder / "train.log").write_text("checks passed in 1.0s: 40 tasks\nTraceback (most recent call last):\n")
    followed = agl("logs", "early", "-f", cwd=tmp_path)
    assert followed.returncode == 0 and followed.stdout.endswith("Traceback (most recent call last):\n")
    stopped = agl("stop", "early", cwd=tmp_path)
    assert stopped.returncode == 1 and "run early is not running (state: not started)" in stopped.stdout
