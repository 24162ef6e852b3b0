"""The stand-in model calls a shell tool when it is offered no calculator (mini-swe-agent offers only `bash`), with a
command that computes the question; a calculator-like tool still comes first."""

from __future__ import annotations

import json
import subprocess

from services.standin import model

QUESTION = [{"role": "user", "content": "Please solve this issue: What is 6 * 7?"}]
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def test_offered_only_a_shell_the_model_runs_the_arithmetic_in_it() -> None:
    reply = model.chat_reply(QUESTION, [BASH], "auto")
    (call,) = reply.tool_calls
    command = json.loads(call.arguments)["command"]
    assert call.name == "bash" and command == "echo $((6 * 7))"
    assert subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout == "42\n"


def test_a_calculator_comes_before_the_shell_and_no_question_no_call() -> None:
    (call,) = model.chat_reply(QUESTION, [BASH, CALCULATOR], "auto").tool_calls
    assert (call.name, json.loads(call.arguments)) == ("calculator", {"expression": "6 * 7"})
    assert model.chat_reply([{"role": "user", "content": "Hello there"}], [BASH], "auto").tool_calls == []
