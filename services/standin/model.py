"""The toy model: renders a prompt and decides the reply, deterministically.

Behaviour (what example agents can rely on):
- A question containing "A op B" (op one of + - * / x, or plus, minus, times, divided by; the last such
  expression in the text) is answered "The answer is N." (N an integer when the result is whole).
- When the request offers a calculator-like tool (name or description mentions calc, math, arith, eval or
  compute), tool_choice is not "none" and the last message is the user's, the model calls that tool instead:
  arguments {"a", "b", "op"} when the tool declares them, otherwise its first string parameter (or
  "expression") gets the expression "A op B". Offered no such tool but a shell (a function named bash or shell,
  as mini-swe-agent's only tool is), it runs `echo $((A op B))` in that tool's first string parameter.
  It writes the call's JSON spaced with non-ASCII escaped (json.dumps's defaults); a request's
  `"standin": {"tool_json": "compact"}` makes it write compact JSON, `"standin": {"tool_arguments": {...}}` these
  arguments. The parsed call hands the arguments back as vLLM's Hermes parser does (json.dumps, non-ASCII kept),
  and the template writes an assistant turn's calls back as Hermes templates do (render_chat).
- After a tool message it answers "The answer is {tool output}."
- Anything else gets "OK. You said: {the first words of the last user message}".
- With `mistake=True` (the engine samples it at temperature > 0 when started with --mistake-rate) a direct
  arithmetic answer is off by one, so that RL groups see rewards that differ, as with a real policy.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

_NUMBER = r"-?\d+(?:\.\d+)?"
_OPERATOR = "\\+|-|\\*|/|x|\u00d7|\u00f7|plus|minus|times|multiplied by|divided by"
_MATH = re.compile(rf"({_NUMBER})\s*({_OPERATOR})\s*({_NUMBER})", re.IGNORECASE)
_TOOLISH = re.compile(r"calc|math|arith|eval|compute", re.IGNORECASE)
_SYMBOL = {"plus": "+", "minus": "-", "times": "*", "x": "*", "\u00d7": "*", "multiplied by": "*"}
_SYMBOL.update({"\u00f7": "/", "divided by": "/"})
_ECHO_WORDS = 12
_SHELL_TOOLS = ("bash", "shell")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """What the model generates: `raw` is the generated text its tokens come from."""

    raw: str
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def content_text(content: Any) -> str:
    """Text of a message content: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _rendered_call(call: Any) -> str:
    """An assistant turn's tool call as the Hermes template writes it back: vLLM parses `arguments` into an object
    (an empty one when it is not JSON) and the template writes it with `tojson` (spaced, non-ASCII as it is)."""
    function = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    name = json.dumps(function.get("name", ""), ensure_ascii=False)
    return f'<tool_call>\n{{"name": {name}, "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None, generation_prompt: bool = True) -> str:
    """The chat template: one block per message (an assistant turn's tool calls as Hermes writes them), then the
    assistant header."""
    parts: list[str] = []
    if tools:
        parts.append(f"<|tools|>\n{json.dumps(tools, sort_keys=True)}\n")
    for message in messages:
        text = content_text(message.get("content"))
        if message.get("tool_calls"):
            calls = "\n".join(_rendered_call(call) for call in message["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        parts.append(f"<|{message.get('role', 'user')}|>\n{text}\n")
    if generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(the content before the first call, the calls) of generated text, as vLLM's Hermes parser reads it: each
    `<tool_call>` JSON object with a name; its arguments handed back as `json.dumps(..., ensure_ascii=False)`. No
    parsable call: the text whole and no calls."""
    calls = []
    for match in _CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        calls.append(ToolCall(_call_id(call["name"], arguments), call["name"], arguments))
    if not calls:
        return text, []
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls


def solve(text: str) -> tuple[str, str] | None:
    """(expression, result) of the last arithmetic question in text, or None."""
    matches = list(_MATH.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    left, operator, right = match.group(1), match.group(2).lower(), match.group(3)
    symbol = _SYMBOL.get(operator, operator)
    a, b = float(left), float(right)
    if symbol == "+":
        value = a + b
    elif symbol == "-":
        value = a - b
    elif symbol == "*":
        value = a * b
    else:
        if b == 0:
            return f"{left} / {right}", "undefined"
        value = a / b
    result = str(int(value)) if value == int(value) else f"{value:.6g}"
    return f"{left} {symbol} {right}", result


def _pick_tool(tools: list[Any] | None, tool_choice: Any) -> dict[str, Any] | None:
    if not tools or tool_choice == "none":
        return None
    functions = [tool.get("function", {}) for tool in tools if isinstance(tool, dict)]
    if isinstance(tool_choice, dict):
        wanted = tool_choice.get("function", {}).get("name")
        return next((fn for fn in functions if fn.get("name") == wanted), None)
    for fn in functions:
        if _TOOLISH.search(f"{fn.get('name', '')} {fn.get('description', '')}"):
            return fn
    for fn in functions:
        if fn.get("name") in _SHELL_TOOLS:
            return fn
    return functions[0] if tool_choice == "required" and functions else None


def _tool_arguments(function: dict[str, Any], expression: str) -> dict[str, Any]:
    properties = (function.get("parameters") or {}).get("properties") or {}
    left, symbol, right = expression.split(" ")
    if {"a", "b"} <= properties.keys():
        arguments: dict[str, Any] = {"a": float(left), "b": float(right)}
        for name in ("op", "operator", "operation"):
            if name in properties:
                arguments[name] = symbol
        return arguments
    name = next((key for key, spec in properties.items() if spec.get("type") == "string"), "expression")
    if function.get("name") in _SHELL_TOOLS:
        return {name: f"echo $(({expression}))"}
    return {name: expression}


def _call_id(name: str, arguments: str) -> str:
    return f"chatcmpl-tool-{zlib.crc32((name + arguments).encode()):08x}"


# How the model spells the JSON of a call it writes (the request's `standin.tool_json`): spaced with non-ASCII
# escaped (json.dumps's defaults, and the default here), or compact.
_TOOL_JSON = {"spaced": {}, "compact": {"separators": (",", ":"), "ensure_ascii": False}}


def _tool_call(function: dict[str, Any], expression: str, knobs: dict[str, Any]) -> Reply:
    given = knobs.get("tool_arguments")
    arguments = given if isinstance(given, dict) else _tool_arguments(function, expression)
    spelling = _TOOL_JSON.get(str(knobs.get("tool_json", "spaced")), {})
    name = function.get("name", "")
    # The parser hands the arguments back re-serialised (vLLM's Hermes parser: json.dumps, non-ASCII as it is).
    parsed = json.dumps(arguments, ensure_ascii=False)
    call = ToolCall(call_id=_call_id(name, parsed), name=name, arguments=parsed)
    raw = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, **spelling)}\n</tool_call>"
    return Reply(raw=raw, content=None, tool_calls=[call])


def _off_by_one(result: str) -> str:
    try:
        value = float(result) + 1
    except ValueError:
        return result + "?"
    return str(int(value)) if value == int(value) else f"{value:.6g}"


def _answer(text: str, mistake: bool = False) -> str:
    solved = solve(text)
    if solved is not None:
        return f"The answer is {_off_by_one(solved[1]) if mistake else solved[1]}."
    words = text.split()[:_ECHO_WORDS]
    return "OK. You said: " + " ".join(words) if words else "OK."


def chat_reply(
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    tool_choice: Any,
    mistake: bool = False,
    knobs: dict[str, Any] | None = None,
) -> Reply:
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        text = f"The answer is {content_text(last.get('content')).strip()}."
        return Reply(raw=text, content=text)
    user_text = content_text(last.get("content"))
    function = _pick_tool(tools, tool_choice) if last.get("role") == "user" else None
    solved = solve(user_text)
    if function is not None and solved is not None:
        return _tool_call(function, solved[0], knobs or {})
    text = _answer(user_text, mistake)
    return Reply(raw=text, content=text)


def completion_reply(prompt: str, mistake: bool = False) -> str:
    """Continuation of a plain-text prompt (answers the last arithmetic question in it, if any)."""
    if solve(prompt) is not None:
        return " " + _answer(prompt, mistake)
    lines = [line for line in prompt.splitlines() if line.strip()]
    return " " + _answer(lines[-1] if lines else prompt)
