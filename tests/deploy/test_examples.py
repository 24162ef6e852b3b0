"""The example agents' pure parts, their datasets and the calculator Job template."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from examples.calc_agent import agent as calc_agent
from examples.math_agent import agent as math_agent
from services.controller.k8s.job_template import render_job
from services.standin import model as standin_model
from tests.deploy.k8s_schema import validate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATASETS = sorted((EXAMPLES / "data").glob("*.jsonl"))


def _tasks(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _exact(question: str) -> Fraction:
    left, op, right = question.removeprefix("What is ").removesuffix("?").split()
    a, b = Fraction(left), Fraction(right)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]


@pytest.mark.parametrize("path", DATASETS, ids=lambda p: p.name)
def test_dataset_items_are_well_formed_and_answers_are_right(path: Path) -> None:
    tasks = _tasks(path)
    assert 8 <= len(tasks) <= 16
    assert len({task["id"] for task in tasks}) == len(tasks)
    for task in tasks:
        assert set(task) == {"id", "question", "answer"}
        assert Fraction(task["answer"]) == _exact(task["question"]), task


def test_datasets_are_the_two_examples() -> None:
    assert [p.name for p in DATASETS] == ["calc.jsonl", "math.jsonl"]


@pytest.mark.parametrize("path", DATASETS, ids=lambda p: p.name)
def test_standin_engine_answers_every_dataset_question(path: Path) -> None:
    # The demo and the e2e tests rely on the stand-in model solving these questions.
    for task in _tasks(path):
        solved = standin_model.solve(task["question"])
        assert solved is not None and Fraction(solved[1]) == Fraction(task["answer"]), task


@pytest.mark.parametrize("agent", [math_agent, calc_agent], ids=["math", "calc"])
def test_score_compares_the_last_number(agent) -> None:
    assert agent.score("The answer is 42.", "42") == 1.0
    assert agent.score("6 * 7 = 42", "42") == 1.0
    assert agent.score("It is -234", "-234") == 1.0
    assert agent.score("1,776", "1776") == 1.0
    assert agent.score("The answer is 41.", "42") == 0.0
    assert agent.score("no idea", "42") == 0.0


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1234 * 56", "69104"),
        ("(3 + 4) * 5", "35"),
        ("999 / 27", "37"),
        ("7 / 2", "3.5"),
        ("-2 ** 3", "-8"),
        ("2 ^ 10", "1024"),
        ("17 % 5", "2"),
        ("17 // 5", "3"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: str) -> None:
    assert calc_agent.calculate(expression) == expected


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('true')", "x + 1", "1 / 0", "2 ** 1000", "'a' * 3", "[1, 2]", "1 +"]
)
def test_calculator_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(calc_agent.CalculatorError):
        calc_agent.calculate(expression)


def test_tool_errors_go_back_to_the_model_as_text() -> None:
    assert calc_agent.run_tool("calculator", json.dumps({"expression": "6 * 7"})) == "42"
    assert calc_agent.run_tool("calculator", "{not json").startswith("error:")
    assert calc_agent.run_tool("calculator", json.dumps({"expr": "1"})).startswith("error:")
    assert calc_agent.run_tool("search", "{}") == "error: unknown tool 'search'"


def test_calculator_tool_is_one_the_standin_engine_calls() -> None:
    # The stand-in calls a tool whose name or description looks like a calculator.
    call = standin_model.chat_reply(
        [{"role": "user", "content": "What is 1234 * 56?"}], [calc_agent.CALCULATOR_TOOL], None
    )
    assert call.tool_calls and call.tool_calls[0].name == "calculator"
    assert calc_agent.run_tool(call.tool_calls[0].name, call.tool_calls[0].arguments) == "69104"


def _render(input_value: object) -> dict:
    return render_job(
        (EXAMPLES / "calc_agent" / "job.yaml.j2").read_text(),
        input_value=input_value,
        rollout_id="r-1",
        attempt_id="a-1",
        namespace="agl",
        env={"AGL_OPENAI_BASE_URL": "http://proxy/v1", "AGL_EVENT_URL": "http://proxy/e", "AGL_KEY": "k"},
        timeout_seconds=60,
        ttl_seconds_after_finished=300,
    )


def test_calc_job_template_renders_a_valid_job_with_the_task() -> None:
    job = _render({"id": "calc-00", "question": "What is 1234 * 56?", "answer": "69104"})
    assert validate(job) == []
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["AGL_TASK_QUESTION"] == "What is 1234 * 56?"
    assert env["AGL_TASK_ANSWER"] == "69104"
    assert {"AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"} <= env.keys()
    assert container["command"] == ["python", "/app/examples/calc_agent/agent.py"]
    assert container["image"] == "agl-agents:latest"


def test_calc_job_template_keeps_hostile_text_one_scalar() -> None:
    question = 'What is 1 + 1?\n"quoted": {braces} - [list] # not a comment\n  indented: yes'
    job = _render({"question": question, "answer": 2, "image": "registry.example/agents:v1"})
    assert validate(job) == []
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["AGL_TASK_QUESTION"] == question
    assert env["AGL_TASK_ANSWER"] == "2"
    assert container["image"] == "registry.example/agents:v1"
    assert yaml.safe_load(yaml.safe_dump(job)) == job
