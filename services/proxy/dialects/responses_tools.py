"""The tools of a Responses request as the engine's chat tools, and the engine's tool calls as Responses items.

The engine's chat API knows one kind of tool: a function with a JSON-schema parameter object. What the Codex CLI
offers besides, and how each reaches the engine:

- `namespace` tools (`{type: namespace, name, description, tools: [...]}`) are flattened: each function (or custom
  tool) inside becomes a function named `<namespace>__<name>` (characters outside `[A-Za-z0-9_-]` become `_`; a
  namespace's own trailing underscores are dropped before the separator). The model's calls of such a function
  come back as the namespaced call Codex expects (`name` the tool's own, `namespace` set), and the history's
  namespaced calls are rendered with the flat name again, so every turn shows the model the same name.
- `custom` tools (free-form input, optionally held to a Lark or regex grammar) become functions with one string
  argument, `input`; the grammar (when there is one) is appended to the description, since the engine does not
  constrain the output to it. The model's call comes back as a `custom_tool_call` item whose `input` is that string.
- `additional_tools` input items add their tools to the request's (a tool declared again, the same, is offered once).
- Built-in tools that the hosted API runs itself (`web_search`, `file_search`, `image_generation`, ...) have no
  engine to run them: they are left out of the engine's request, and each one left out is a warning recorded with
  the call (and logged) rather than a 400, so an agent that offers them by default still runs.

Pure: no I/O. Everything the answer needs is recomputed from the agent's request (the proxy keeps no state).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from services.proxy.dialects.translation import require
from services.proxy.errors import ProxyError

SEPARATOR = "__"
CUSTOM_ARGUMENT = "input"
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def flat_name(namespace: str | None, name: str) -> str:
    """The function name the engine sees for a tool `name` (inside `namespace`, when given)."""
    name = _NOT_ALLOWED.sub("_", name)
    if not namespace:
        return name
    return _NOT_ALLOWED.sub("_", namespace).rstrip("_") + SEPARATOR + name


@dataclass(frozen=True)
class OfferedTool:
    flat: str  # the function name the engine sees
    name: str  # the tool's own name
    namespace: str | None
    custom: bool


@dataclass
class ToolTable:
    """The request's tools: the engine's chat tools, and each engine name's tool."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    by_flat: dict[str, OfferedTool] = field(default_factory=dict)
    # Built-in tools left out of the engine's request: (where, type).
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def warnings(self) -> list[str]:
        return [
            f"{where} is a built-in {kind!r} tool, which the engine cannot run: it was left out of the request."
            for where, kind in self.dropped
        ]

    def output_item(self, call_id: str, flat: str, arguments: str, status: str = "completed") -> dict[str, Any]:
        """The Responses output item for the engine's call of `flat` with `arguments` (JSON text)."""
        tool = self.by_flat.get(flat)
        if tool is None:  # a name the request did not offer: passed on as the model wrote it
            return function_call_item(call_id, flat, arguments, None, status)
        if tool.custom:
            return custom_call_item(call_id, tool.name, custom_input(arguments), tool.namespace, status)
        return function_call_item(call_id, tool.name, arguments, tool.namespace, status)

    def is_custom(self, flat: str) -> bool:
        tool = self.by_flat.get(flat)
        return tool is not None and tool.custom


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def function_call_item(
    call_id: str, name: str, arguments: str, namespace: str | None, status: str = "completed"
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": _new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item


def custom_call_item(
    call_id: str, name: str, text: str, namespace: str | None, status: str = "completed"
) -> dict[str, Any]:
    item = {"type": "custom_tool_call", "id": _new_id("ctc"), "call_id": call_id, "name": name, "input": text}
    item["status"] = status
    if namespace:
        item["namespace"] = namespace
    return item


def custom_input(arguments: str) -> str:
    """A custom tool's input from the engine's arguments: `{"input": "..."}` as offered; a bare JSON string; else
    the arguments text itself (what the model wrote, so nothing it sampled is lost)."""
    try:
        value = json.loads(arguments) if arguments else ""
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_ARGUMENT), str):
        return value[CUSTOM_ARGUMENT]
    if isinstance(value, str):
        return value
    return arguments


def custom_arguments(text: str) -> str:
    """The arguments text a custom tool's call is shown to the engine with in the history."""
    return json.dumps({CUSTOM_ARGUMENT: text}, ensure_ascii=False)


def _function(tool: dict[str, Any], where: str, namespace: str | None) -> tuple[dict[str, Any], OfferedTool]:
    require(isinstance(tool.get("name"), str) and bool(tool["name"]), f"{where} (function) needs `name`, a string.")
    parameters = tool.get("parameters") or {"type": "object"}
    require(isinstance(parameters, dict), f"{where}.parameters must be an object.")
    flat = flat_name(namespace, tool["name"])
    function: dict[str, Any] = {"name": flat, "parameters": parameters}
    for name in ("description", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}, OfferedTool(flat, tool["name"], namespace, custom=False)


def _custom(tool: dict[str, Any], where: str, namespace: str | None) -> tuple[dict[str, Any], OfferedTool]:
    require(isinstance(tool.get("name"), str) and bool(tool["name"]), f"{where} (custom) needs `name`, a string.")
    description = tool.get("description") or ""
    require(isinstance(description, str), f"{where}.description must be a string.")
    fmt = tool.get("format")
    if fmt is not None:
        require(isinstance(fmt, dict), f"{where}.format must be an object.")
        kind = fmt.get("type")
        if kind == "grammar":
            syntax, definition = fmt.get("syntax"), fmt.get("definition")
            require(
                isinstance(syntax, str) and isinstance(definition, str),
                f"{where}.format (grammar) needs `syntax` and `definition`, strings.",
            )
            description += f"\n\nThe `{CUSTOM_ARGUMENT}` string must follow this {syntax} grammar:\n{definition}"
        else:
            require(kind == "text", f"{where}.format.type must be text or grammar.")
    flat = flat_name(namespace, tool["name"])
    parameters = {
        "type": "object",
        "properties": {CUSTOM_ARGUMENT: {"type": "string", "description": "The tool's whole input, as text."}},
        "required": [CUSTOM_ARGUMENT],
    }
    function = {"name": flat, "description": description.strip(), "parameters": parameters}
    return {"type": "function", "function": function}, OfferedTool(flat, tool["name"], namespace, custom=True)


def _add(table: ToolTable, tool: Any, where: str, namespace: str | None = None) -> None:
    require(isinstance(tool, dict), f"{where} must be an object.")
    kind = tool.get("type")
    require(isinstance(kind, str) and bool(kind), f"{where} needs `type`, a string.")
    if kind == "namespace" and namespace is None:
        name, children = tool.get("name"), tool.get("tools")
        require(isinstance(name, str) and bool(name), f"{where} (namespace) needs `name`, a string.")
        require(isinstance(children, list), f"{where} (namespace) needs `tools`, a list.")
        for k, child in enumerate(children):
            _add(table, child, f"{where}.tools[{k}]", name)
        return
    if kind == "function":
        chat, offered = _function(tool, where, namespace)
    elif kind == "custom":
        chat, offered = _custom(tool, where, namespace)
    elif namespace is not None:
        raise ProxyError(
            "invalid_request", f"{where} is a {kind!r} tool; a namespace may hold function and custom tools."
        )
    else:
        table.dropped.append((where, kind))
        return
    other = table.by_flat.get(offered.flat)
    if other is not None and other == offered and chat in table.tools:
        return  # declared again (the request's tools and an additional_tools item, or two such items): offered once
    if other is not None:
        raise ProxyError(
            "invalid_request",
            f"{where} is offered to the engine as {offered.flat!r}, the name of another tool of the request; "
            "rename one of them.",
        )
    table.by_flat[offered.flat] = offered
    table.tools.append(chat)


def tool_table(body: dict[str, Any]) -> ToolTable:
    """The tools of `body` (its `tools` and its input's `additional_tools` items); 400 naming the first bad one."""
    table = ToolTable()
    tools = body.get("tools")
    if tools is not None:
        require(isinstance(tools, list), "`tools` must be a list.")
        for k, tool in enumerate(tools):
            _add(table, tool, f"tools[{k}]")
    items = body.get("input")
    if isinstance(items, list):
        for k, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") == "additional_tools":
                extra = item.get("tools")
                require(isinstance(extra, list), f"input[{k}] (additional_tools) needs `tools`, a list.")
                for j, tool in enumerate(extra):
                    _add(table, tool, f"input[{k}].tools[{j}]")
    return table


def tool_choice(choice: Any) -> Any:
    """The chat tool_choice for a Responses one (a named function or custom tool by its engine name)."""
    if choice in ("auto", "none", "required"):
        return choice
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if named and isinstance(choice.get("name"), str):
        namespace = choice.get("namespace")
        require(namespace is None or isinstance(namespace, str), "`tool_choice.namespace` must be a string.")
        return {"type": "function", "function": {"name": flat_name(namespace, choice["name"])}}
    raise ProxyError(
        "invalid_request", "`tool_choice` must be auto, none, required, or {type: function or custom, name}."
    )
