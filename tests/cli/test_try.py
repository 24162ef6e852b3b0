"""`agl try` as a user runs it: the installed `agl` started in the user's folder, which holds their agent and their
tasks; every service is the real one, started by the command, and the engine is the stand-in (vLLM-shaped, no
model). Each mistake of issue 43 is reported in one line, non-zero, within 10 s of the services being up; the
example math agent passes and its rollouts are shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import processes_mentioning

AGL = Path(sys.executable).parent / "agl"
CHECKOUT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

USER_AGENT = """
import os

import httpx
from openai import OpenAI


def ask(base_url):
    client = OpenAI(base_url=base_url, api_key=os.environ["AGL_KEY"], max_retries=0)
    return client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": os.environ["SHOP_QUESTION"]}], max_tokens=16
    ).choices[0].message.content or ""


class Crashes:
    def run(self):
        ask(os.environ["AGL_OPENAI_BASE_URL"])
        return 1 / 0


class NoReward:
    def run(self):
        ask(os.environ["AGL_OPENAI_BASE_URL"])


class Sleeps:
    def run(self):
        import time

        time.sleep(120)


class WrongUrl:
    def run(self):
        ask("http://127.0.0.1:9/v1")  # its own hard-coded URL, not the one AGL gives it
        return 1.0
"""
MATH = ["--agent-class", "examples.math_agent.agent:MathAgent"]
MATH_ENV = ["--env-map", "AGL_TASK_QUESTION=input.question", "--env-map", "AGL_TASK_ANSWER=input.answer"]
SHOP_ENV = ["--env-map", "SHOP_QUESTION=input.question"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "shopagent").mkdir()
    (tmp_path / "shopagent" / "__init__.py").write_text("")
    (tmp_path / "shopagent" / "agent.py").write_text(USER_AGENT)
    with (tmp_path / "math.jsonl").open("w") as tasks:
        for a in range(6):
            tasks.write(json.dumps({"question": f"What is {a} + 3?", "answer": str(a + 3)}) + "\n")
    (tmp_path / "broken.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n{"question": 1 +}\n')
    return tmp_path


@dataclass
class Run:
    code: int
    lines: list[tuple[float, str]]  # (seconds since start, line) of stdout
    err: str

    def seen(self, text: str) -> float:
        return next(at for at, line in self.lines if text in line)

    @property
    def out(self) -> str:
        return "\n".join(line for _, line in self.lines)


def agl_try(*args: str, cwd: Path) -> Run:
    """The installed `agl try`, its stdout lines stamped as they arrive."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_")}
    env["PYTHONPATH"] = str(CHECKOUT)  # this checkout's code, as the installed script imports it
    started = time.monotonic()
    err: list[str] = []
    with subprocess.Popen(
        [str(AGL), "try", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: err.append(stderr.read()))
        reader.start()
        lines = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]
        code = proc.wait(timeout=240)
        reader.join()
    return Run(code, lines, "".join(err))


def test_the_math_agent_passes_and_its_rollouts_are_shown(workdir: Path) -> None:
    run = agl_try(*MATH, "--data", "math.jsonl", *MATH_ENV, "--tasks", "3", cwd=workdir)
    assert run.code == 0, run.out + run.err
    for task in (1, 2, 3):
        assert f"task {task} (" in run.out and "succeeded, reward 1, 1 model call(s)" in run.out
    assert "task 4 (" not in run.out  # --tasks 3
    assert "user: What is 2 + 3?" in run.out and "-> 'assistant: The answer is 5.'" in run.out
    trained = [line for _, line in run.lines if "would train:" in line]
    assert len(trained) == 3 and all("1 row(s)" in line and " prompt + " in line for line in trained)
    assert run.out.splitlines()[-1].startswith("agl try: ok")
    assert processes_mentioning(str(workdir)) == []


# Mistakes the agent makes while it runs: found by the rollouts, after the services are up.
ROLLOUT_MISTAKES = {
    "crash": (["--agent-class", "shopagent.agent:Crashes", *SHOP_ENV], "ZeroDivisionError: division by zero"),
    "no reward": (["--agent-class", "shopagent.agent:NoReward", *SHOP_ENV], "succeeded WITHOUT A REWARD"),
    "wrong base URL": (
        ["--agent-class", "shopagent.agent:WrongUrl", *SHOP_ENV],
        "APIConnectionError: Connection error. (no call reached AGL_OPENAI_BASE_URL",
    ),
    "command exits": (["--command", f"{sys.executable} -c 'raise SystemExit(3)'"], "agent exited with code 3"),
}


@pytest.mark.parametrize("mistake", sorted(ROLLOUT_MISTAKES))
def test_a_mistake_while_the_agent_runs_is_one_line_within_10s(workdir: Path, mistake: str) -> None:
    argv, expected = ROLLOUT_MISTAKES[mistake]
    run = agl_try(*argv, "--data", "math.jsonl", cwd=workdir)
    assert run.code == 1, run.out + run.err
    [(reported, line)] = [(at, line) for at, line in run.lines if line.startswith("agl try:")]
    assert expected in line and line.count(f"{workdir}/agl-runs/try-") == 1, line  # its agent log, named once
    assert "and 3 more rollout(s) with a problem" in line  # the four tasks met the same mistake
    took = reported - run.seen("services up in")
    print(f"{mistake}: {took:.1f}s after the services were up: {line}")
    assert took < 10.0
    assert processes_mentioning(str(workdir)) == []


# Mistakes in what the user gave: found by agl train's own checks, before anything starts.
INPUT_MISTAKES = {
    "wrong class": (
        ["--agent-class", "shopagent.agent:Crashez", "--data", "math.jsonl"],
        "--agent-class shopagent.agent:Crashez: cannot be loaded: AttributeError",
    ),
    "unimportable module": (["--agent-class", "shopagent.agnet:Crashes", "--data", "math.jsonl"], "shopagent.agnet"),
    "bad JSONL line": ([*MATH, "--data", "broken.jsonl"], "broken.jsonl:2: not valid JSON"),
}


@pytest.mark.parametrize("mistake", sorted(INPUT_MISTAKES))
def test_a_mistake_in_the_options_is_one_line_within_10s_before_anything_starts(workdir: Path, mistake: str) -> None:
    argv, expected = INPUT_MISTAKES[mistake]
    started = time.monotonic()
    run = agl_try(*argv, cwd=workdir)
    took = time.monotonic() - started
    assert run.code == 2, run.out + run.err
    [line] = run.err.strip().splitlines()
    assert line.startswith("agl: ") and expected in line, line
    assert "starting ledger" not in run.out
    assert took < 10.0, took


def test_ctrl_c_stops_every_service_with_one_line(workdir: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_")}
    env["PYTHONPATH"] = str(CHECKOUT)
    argv = [str(AGL), "try", "--agent-class", "shopagent.agent:Sleeps", *SHOP_ENV, "--data", "math.jsonl"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen(argv, cwd=workdir, env=env, text=True, **pipes) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "services up in" in line:
                break
        time.sleep(1.0)  # the rollouts are running (their agents sleep)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out + err
    assert "agl try: interrupted by SIGINT; everything it started has been stopped" in out
    assert "Traceback" not in err
    assert processes_mentioning(str(workdir)) == []
