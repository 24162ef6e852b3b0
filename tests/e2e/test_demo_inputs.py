"""`tools/demo.py --quick` checks what the user gave before anything starts: counts, the dataset (file and line
named), the engine (one GET /models); an agent class outside the repo loads (the user's PYTHONPATH is kept); and a
reward the proxy refuses shows up in the summary with the proxy's own message, not the agent's last stderr line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GOOD_TASK = '{"id": "t1", "question": "What is 2 + 2?", "answer": "4"}'


def demo(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str, float]:
    """Runs the demo as a user would; (exit code, stdout + stderr, seconds)."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("AGL_") and key != "ENGINE_URL"}
    argv = [sys.executable, "tools/demo.py", "--quick", "--quiet"]
    argv += ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), *args]
    started = time.monotonic()
    result = subprocess.run(
        argv, cwd=REPO_ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def assert_refused_before_starting(code: int, output: str) -> None:
    assert code != 0, output
    assert "Traceback" not in output, output
    assert "starting " not in output, output  # no service was started


@pytest.mark.parametrize(("flag", "value"), [("--samples", "0"), ("--group-size", "0"), ("--samples", "-3")])
def test_zero_counts_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    code, output, _ = demo(tmp_path, flag, value)
    assert_refused_before_starting(code, output)
    assert flag in output and "at least 1" in output


def test_zero_deadline_is_refused(tmp_path: Path) -> None:
    code, output, _ = demo(tmp_path, "--deadline", "0")
    assert_refused_before_starting(code, output)
    assert "--deadline" in output


def test_missing_dataset_is_one_line_naming_it(tmp_path: Path) -> None:
    code, output, _ = demo(tmp_path, "--dataset", "nope.jsonl")
    assert_refused_before_starting(code, output)
    assert output.strip() == "dataset nope.jsonl: no such file"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([GOOD_TASK, '{"id": "t2", "question": "x", "answer": ', GOOD_TASK], "line 2: not valid JSON"),
        ([GOOD_TASK, "", "[1, 2]"], "line 3: a task must be a JSON object, got list"),
        ([GOOD_TASK, '{"id": "t2", "question": "q"}'], "line 2: the task has no 'answer'"),
        (["", "  "], "no tasks"),
    ],
)
def test_dataset_errors_name_the_file_and_the_line(tmp_path: Path, lines: list[str], expected: str) -> None:
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("\n".join(lines) + "\n")
    code, output, _ = demo(tmp_path, "--dataset", str(dataset))
    assert_refused_before_starting(code, output)
    assert f"dataset {dataset}" in output and expected in output, output


def test_an_engine_that_does_not_answer_is_one_message_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here
    url = f"http://127.0.0.1:{port}/v1"
    code, output, seconds = demo(tmp_path, "--engine-url", url)
    assert_refused_before_starting(code, output)
    lines = output.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "GET" in lines[0] and "ENGINE_URL" in lines[0], output
    print(f"unreachable engine refused in {seconds:.1f}s with one line")


def test_agent_outside_the_repo_loads_and_a_refused_reward_shows_the_proxys_message(tmp_path: Path) -> None:
    """A user's agent module (on the user's PYTHONPATH, outside the repo) that posts `rewrd` instead of `reward`: the
    demo loads it, and the summary says the proxy refused the event and why."""
    package = tmp_path / "mine"
    package.mkdir()
    (package / "typo_agent.py").write_text(
        textwrap.dedent(
            """
            import os

            import httpx


            class TypoAgent:
                def run(self):
                    headers = {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}
                    body = {"event_type": "rewrd", "data": {"value": 1.0}}
                    httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers, timeout=30).raise_for_status()
            """
        )
    )
    pythonpath = os.pathsep.join(filter(None, [str(package), os.environ.get("PYTHONPATH", "")]))
    args = ["--agent-class", "typo_agent:TypoAgent", "--samples", "1", "--group-size", "2", "--deadline", "90"]
    code, output, _ = demo(tmp_path, *args, env={"PYTHONPATH": pythonpath}, timeout=180)
    assert code == 1, output
    assert "cannot load agent class" not in output, output
    failures = [line for line in output.splitlines() if ": failed: " in line]
    assert len(failures) == 2, output
    for line in failures:
        assert "proxy refused an event (422 invalid_event)" in line and "misspelled reward" in line, output
