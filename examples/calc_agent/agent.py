"""Multi-turn calculator agent with OpenAI function calling, written the way Agent Lightning v1.0 agents are.

No agent framework: a plain loop over the official `openai` SDK. The model may call the `calculator` tool
(run here, in-process) as often as it likes within MAX_TURNS; its final answer is scored against
AGL_TASK_ANSWER and the reward is posted to AGL_EVENT_URL. Every model call goes through the proxy in
AGL_OPENAI_BASE_URL, so each turn becomes one recorded call of the rollout.

Run it as a script (`python examples/calc_agent/agent.py`) or as an agent class
(`agent_class: "agent:CalcAgent"` with this folder on PYTHONPATH).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import httpx
from openai import OpenAI

# The proxy replaces the model name with the one it serves; any name works here.
MODEL = "policy"
MAX_TURNS = 6
SYSTEM_PROMPT = (
    "You solve arithmetic problems. Use the calculator tool for every computation, "
    "then reply with the final number only."
)
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "For example: (3 + 4) * 5"}},
            "required": ["expression"],
        },
    },
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or cannot be evaluated."""


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise CalculatorError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text (whole numbers without ".0"); no eval()."""
    try:
        value = _evaluate(ast.parse(expression.replace("^", "**"), mode="eval"))
    except (SyntaxError, ZeroDivisionError, OverflowError) as exc:
        raise CalculatorError(str(exc) or type(exc).__name__) from exc
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def run_tool(name: str, arguments: str) -> str:
    """Runs one tool call; errors go back to the model as text, as a tool would report them."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        expression = json.loads(arguments or "{}")["expression"]
        return calculate(str(expression))
    except (json.JSONDecodeError, KeyError, TypeError, CalculatorError) as exc:
        return f"error: {exc}"


def last_number(text: str) -> float | None:
    """The last number written in text, or None when there is none."""
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def score(reply: str, expected: str) -> float:
    """1.0 when the reply's last number equals the expected answer, else 0.0."""
    got, want = last_number(reply), last_number(expected)
    if got is None or want is None:
        return 0.0
    return 1.0 if abs(got - want) <= 1e-6 * max(1.0, abs(want)) else 0.0


def post_reward(event_url: str, key: str, value: float, message: str = "", source: str = "calc_agent") -> None:
    """Posts the reward event; raises when the proxy does not accept it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"event_type": "reward", "data": {"value": value, "message": message, "source": source}}
    response = httpx.post(event_url, json=body, headers=headers, timeout=30.0)
    response.raise_for_status()


class CalcAgent:
    """Talks with the model, running its calculator calls, until it gives a final answer."""

    def run(self) -> float:
        key = os.environ.get("AGL_KEY", "")
        question = os.environ["AGL_TASK_QUESTION"]
        expected = os.environ["AGL_TASK_ANSWER"]
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key or "EMPTY", max_retries=5)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        reply, tool_calls = "", 0
        for _ in range(MAX_TURNS):
            completion = client.chat.completions.create(
                model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=128
            )
            message = completion.choices[0].message
            calls = [call for call in message.tool_calls or [] if call.type == "function"]
            if not calls:
                reply = message.content or ""
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                        for call in calls
                    ],
                }
            )
            for call in calls:
                result = run_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                tool_calls += 1
        reward = score(reply, expected)
        message_text = f"expected {expected}, got {reply!r} after {tool_calls} tool call(s)"
        post_reward(os.environ["AGL_EVENT_URL"], key, reward, message=message_text)
        print(f"question={question!r} reply={reply!r} tool_calls={tool_calls} reward={reward}", file=sys.stderr)
        return reward


def main() -> int:
    CalcAgent().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
