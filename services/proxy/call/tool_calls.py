"""What became of the tool calls in one model response: parsed, unparsed, naming an unknown tool, bad arguments.

Pure. The engine's tool-call parser turns the model's call text into `tool_calls`; when the text does not parse
(malformed JSON, a call cut off by max_tokens, an engine started without a parser) the engine hands the text back
as content and the agent sees an ordinary answer: a run where tools "never fire" looks healthy. The proxy counts
what it can see on every call, so the trainer's step health can show it (see ToolCallStats in the contract).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

# Markers the widespread tool-call formats open a call with (Hermes/Qwen, Granite, Mistral, Llama 3, DeepSeek V3).
# Left in a response's text, each one is a call that was written and not parsed.
# DeepSeek's marker is written with fullwidth bars and lower blocks: "<\uff5ctool\u2581call\u2581begin\uff5c>".
TOOL_CALL_MARKERS = (
    "<tool_call>",
    "<|tool_call|>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
)


def offered_tool_names(body: dict[str, Any]) -> frozenset[str] | None:
    """Names of the function tools a chat request offers; None when it offers none."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    names = set()
    for tool in tools:
        if isinstance(tool, dict):
            function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            name = function.get("name")
            if isinstance(name, str):
                names.add(name)
    return frozenset(names)


def _valid_arguments(arguments: Any) -> bool:
    if isinstance(arguments, dict):
        return True
    if not isinstance(arguments, str):
        return False
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def tool_call_stats(offered: frozenset[str] | None, content: str | None, calls: Sequence[Any]) -> dict[str, int] | None:
    """ToolCallStats fields for one response (its text and parsed calls); None when the request offered no tools
    and the response made no call (nothing to count)."""
    if offered is None and not calls:
        return None
    unknown = invalid = 0
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            unknown += 1
            invalid += 1
            continue
        name = function.get("name")
        if not isinstance(name, str) or not name or (offered is not None and name not in offered):
            unknown += 1
        if not _valid_arguments(function.get("arguments")):
            invalid += 1
    text = content if isinstance(content, str) else ""
    unparsed = sum(text.count(marker) for marker in TOOL_CALL_MARKERS) if text else 0
    return {
        "offered_tools": len(offered or ()),
        "parsed_calls": len(calls),
        "unparsed_calls": unparsed,
        "unknown_tool_calls": unknown,
        "invalid_argument_calls": invalid,
    }


_PARSER_FLAG = b"--tool-call-parser"


def missing_parser_message(status: int, content: bytes) -> str | None:
    """The agent's error for an engine that refused a request offering tools because it has no tool-call parser
    (vLLM answers 400 naming --tool-call-parser), naming the flag of each engine AGL users start; else None."""
    if status != 400 or _PARSER_FLAG not in content:
        return None
    engine_said = content.decode("utf-8", "replace")
    with contextlib.suppress(ValueError, KeyError, TypeError):  # not vLLM's error shape: its text as it came
        engine_said = str(json.loads(engine_said)["error"]["message"])
    return (
        "The engine cannot answer a request that offers `tools`: it was started without a tool-call parser. Start "
        "it with one: `agl-engine --tool-call-parser hermes` (AGL_ENGINE_TOOL_CALL_PARSER; the default), or vLLM "
        f"with `--enable-auto-tool-choice --tool-call-parser NAME` for the model's format. The engine said: "
        f"{engine_said[:300]}"
    )
