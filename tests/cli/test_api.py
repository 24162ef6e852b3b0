"""The Python API (services/api.py) as a user's script calls it, in a folder of its own: the commands' own checks
and one-line errors raised as AglError with the command's exit code, and `try_agent` through the whole stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import processes_mentioning

CHECKOUT = Path(__file__).resolve().parents[2]


def script(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_")}
    env["PYTHONPATH"] = str(CHECKOUT)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_bad_input_is_the_commands_one_line_raised_with_its_exit_code(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n')
    result = script(
        """
from services import api as agl
MATH = "examples.math_agent.agent:MathAgent"
calls = {
    "no data": lambda: agl.train(agent_class="x:Y"),
    "unknown option": lambda: agl.train(data="tasks.jsonl", agent_class="x:Y", warp_speed=9),
    "sft without data": lambda: agl.train(data="tasks.jsonl", agent_class=MATH, tasks_per_step=1, sft_steps=5),
    "no model to score": lambda: agl.evaluate(data="tasks.jsonl", agent_class="x:Y"),
    "no run": lambda: agl.export("nothing-here"),
    "no stored ledger": lambda: agl.runs("nowhere"),
}
for name, call in calls.items():
    try:
        call()
    except agl.AglError as err:
        print(f"{name}|{err.code}|{err}")
""",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = dict((line.split("|")[0], line.split("|", 1)[1]) for line in result.stdout.splitlines())
    assert lines["no data"] == "2|--data FILE is required (the training tasks, one JSON object per line)"
    assert lines["unknown option"].startswith("2|unknown option(s) warp_speed; this command takes agent_class, ")
    assert lines["sft without data"] == "2|--sft-steps applies to a supervised start: give --sft-data FILE"
    assert lines["no model to score"].startswith("2|--model DIR is required")
    assert lines["no run"].startswith("2|no run 'nothing-here'")
    assert lines["no stored ledger"].startswith("2|--from nowhere: no stored ledger there")
    assert not (tmp_path / "agl-runs").exists(), "a refused call left a run folder"


def test_try_agent_runs_the_agent_through_the_stack_and_returns_its_exit_code(tmp_path: Path) -> None:
    with (tmp_path / "math.jsonl").open("w") as tasks:
        for a in range(3):
            tasks.write(json.dumps({"question": f"What is {a} + 3?", "answer": str(a + 3)}) + "\n")
    result = script(
        """
import io
from services import api as agl
out = io.StringIO()
code = agl.try_agent(
    agent_class="examples.math_agent.agent:MathAgent", data="math.jsonl", tasks=2, out=out,
    env_map={"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"},
)
print(code)
print(out.getvalue().splitlines()[-1])
""",
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    code, last = result.stdout.splitlines()[-2:]
    assert code == "0" and last.startswith("agl try: ok"), result.stdout
    assert processes_mentioning(str(tmp_path)) == []
