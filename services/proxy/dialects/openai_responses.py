"""The OpenAI Responses API (`POST .../v1/responses`) as chat completions, and chat answers as Responses answers.

Covers what the Codex CLI and the OpenAI Agents SDK send when they keep the conversation themselves (`store`
false, the whole input every turn): instructions, message items (text and image parts, any role; developer turns
become system turns), function_call and function_call_output items, Codex's custom_tool_call and
custom_tool_call_output items and namespaced function calls, additional_tools items, function, custom and
namespace tools (dialects/responses_tools.py), tool_choice, text.format (json_schema, json_object), sampling options,
streaming. Reasoning items the agent sends back are dropped; reasoning the engine returns becomes a reasoning item.
Built-in tools are left out of the engine's request with a warning recorded on the call. Fields with no engine
counterpart (`reasoning`, `include`, `prompt_cache_key`, `client_metadata`, `text.verbosity`, `store`, `user`,
...) are checked and accepted; docs/reference/agent-apis.md says what each does here. `previous_response_id`
continues a response of the same rollout attempt, found in the ledger (dialects/responses_chain.py); `background` and
`conversation` are refused with a 400 naming them (nothing runs past its request; no conversation outlives a
rollout).

The translation both ways (request in, answer out, streamed and not) must agree item by item, so both directions
are here.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.proxy.dialects.responses_chain import chained, earlier_id, response_id
from services.proxy.dialects.responses_tools import (
    ToolTable,
    custom_arguments,
    custom_input,
    flat_name,
    tool_choice,
    tool_table,
)
from services.proxy.dialects.translation import RESPONSES, Dialect, first_choice, openai_error_parts, require, sse
from services.proxy.errors import ProxyError

_VLLM_EXTRAS = ("seed", "top_k", "min_p", "repetition_penalty", "chat_template_kwargs", "min_tokens", "stop")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


# -- request ------------------------------------------------------------------------------------------------------


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message item's content as chat content: a string, or parts when it holds an image."""
    if isinstance(content, str):
        return content
    require(isinstance(content, list), f"{where}.content must be a string or a list of content parts.")
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        place = f"{where}.content[{k}]"
        require(isinstance(part, dict), f"{place} must be an object.")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            require(isinstance(text, str), f"{place} ({kind}) needs `text`, a string.")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            require(
                isinstance(part.get("image_url"), str),
                f"{place} (input_image) needs `image_url`; file ids are not supported.",
            )
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise ProxyError("invalid_request", f"{place} is a {kind!r} part, which is not supported.")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    text = _content(output, where)
    require(isinstance(text, str), f"{where}.output may hold text parts only.")
    return text  # type: ignore[return-value]


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        require(isinstance(instructions, str), "`instructions` must be a string.")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        require(bool(items), "`input` must not be empty.")
        messages.append({"role": "user", "content": items})
        return messages
    require(isinstance(items, list) and bool(items), "`input` must be a non-empty string or list of items.")
    for k, item in enumerate(items):
        where = f"input[{k}]"
        require(isinstance(item, dict), f"{where} must be an object.")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            require(
                role in ("user", "assistant", "system", "developer"),
                f"{where}.role must be user, assistant, system or developer.",
            )
            messages.append(
                {"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)}
            )
        elif kind in ("function_call", "custom_tool_call"):
            require(
                isinstance(item.get("call_id"), str) and isinstance(item.get("name"), str),
                f"{where} ({kind}) needs `call_id` and `name`.",
            )
            namespace = item.get("namespace")
            require(namespace is None or isinstance(namespace, str), f"{where}.namespace must be a string.")
            if kind == "function_call":
                arguments = item.get("arguments", "")
                require(isinstance(arguments, str), f"{where}.arguments must be a string.")
            else:
                require(isinstance(item.get("input"), str), f"{where} (custom_tool_call) needs `input`, a string.")
                arguments = custom_arguments(item["input"])
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": flat_name(namespace, item["name"]), "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str | None):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            require(isinstance(item.get("call_id"), str), f"{where} ({kind}) needs `call_id`.")
            output = _output_text(item.get("output", ""), where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind in ("reasoning", "additional_tools"):  # additional_tools: their tools join the request's
            continue
        else:
            raise ProxyError("invalid_request", f"{where} is a {kind!r} item, which is not supported.")
    return messages


# Fields accepted and not forwarded (the engine has no counterpart; docs/reference/agent-apis.md says what each
# does here), with the JSON type each must have. `reasoning` is not forwarded: whether the model reasons is its chat
# template's choice, and reasoning it writes comes back as a reasoning item; `include` asks for encrypted reasoning,
# which this proxy never returns; `prompt_cache_key` is unneeded (the engine's prefix cache is automatic and a
# rollout's calls go to one engine); the rest is the agent's bookkeeping (`metadata` is echoed in the answer).
_ACCEPTED = {
    "reasoning": (dict, "an object"),
    "include": (list, "a list of strings"),
    "prompt_cache_key": (str, "a string"),
    "client_metadata": (dict, "an object"),
    "metadata": (dict, "an object"),
    "store": (bool, "a boolean"),
    "user": (str, "a string"),
    "safety_identifier": (str, "a string"),
    "service_tier": (str, "a string"),
    "truncation": (str, "a string"),
}
_VERBOSITY = ("low", "medium", "high")


def _check_accepted(body: dict[str, Any]) -> None:
    for name, (kind, what) in _ACCEPTED.items():
        value = body.get(name)
        require(value is None or isinstance(value, kind), f"`{name}` must be {what}.")
    include = body.get("include") or []
    require(all(isinstance(entry, str) for entry in include), "`include` must be a list of strings.")
    reasoning = body.get("reasoning") or {}
    for name in ("effort", "summary", "generate_summary"):
        value = reasoning.get(name)
        require(value is None or isinstance(value, str), f"`reasoning.{name}` must be a string.")


def _response_format(text: Any) -> dict[str, Any] | None:
    require(isinstance(text, dict), "`text` must be an object.")
    verbosity = text.get("verbosity")
    require(verbosity is None or verbosity in _VERBOSITY, "`text.verbosity` must be low, medium or high.")
    fmt = text.get("format")
    if fmt is None:
        return None
    require(isinstance(fmt, dict), "`text.format` must be an object.")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise ProxyError("invalid_request", "`text.format.type` must be text, json_object or json_schema.")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The request's own chat translation (a previous_response_id's conversation is joined by the proxy: chain)."""
    background = body.get("background")
    require(background is None or isinstance(background, bool), "`background` must be a boolean.")
    require(
        not background,
        "`background: true` is not supported: a call is answered while its request is open (the rollout's call "
        "is recorded before its answer); send it without `background`.",
    )
    require(
        body.get("conversation") is None,
        "`conversation` is not supported: no conversation is kept across calls or rollouts; continue a response "
        "of this rollout with `previous_response_id`, or send the whole conversation in `input`.",
    )
    earlier_id(body)
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "`stream` must be a boolean.")
    _check_accepted(body)
    table = tool_table(body)
    chat: dict[str, Any] = {"messages": _messages(body)}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    limit = body.get("max_output_tokens")
    if limit is not None:
        require(
            isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1,
            "`max_output_tokens` must be a positive integer.",
        )
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p", "parallel_tool_calls", *_VLLM_EXTRAS):
        if body.get(name) is not None:
            chat[name] = body[name]
    if table.tools:
        chat["tools"] = table.tools
    if body.get("tool_choice") is not None:
        choice = tool_choice(body["tool_choice"])
        if table.tools or not table.dropped:  # with only built-ins offered (all left out) there is nothing to choose
            chat["tool_choice"] = choice
    if body.get("text") is not None:
        response_format = _response_format(body["text"])
        if response_format is not None:
            chat["response_format"] = response_format
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# -- response -----------------------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def _envelope(
    request: dict[str, Any], response_id: str, created_at: int, model: str, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id") or None,
        "reasoning": None,
        "store": False,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "user": None,
    }


def _response_id(chat_id: Any) -> str:
    return response_id(chat_id) or _new_id("resp")


def _status(choice: dict[str, Any]) -> str:
    return "incomplete" if choice.get("finish_reason") == "length" else "completed"


def from_chat(response: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    choice = first_choice(response)
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(_reasoning_item(_new_id("rs"), reasoning))
    if message.get("content"):
        output.append(_text_item(_new_id("msg"), message["content"]))
    table = tool_table(request)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        call_id = call.get("id") or _new_id("call")
        output.append(table.output_item(call_id, function.get("name") or "", function.get("arguments") or ""))
    created = response.get("created") if isinstance(response.get("created"), int) else int(time.time())
    body = _envelope(
        request, _response_id(response.get("id")), created, response.get("model") or "", _status(choice), output
    )
    body["usage"] = _usage(response.get("usage"))
    return body


def error_body(body: dict[str, Any], status: int) -> dict[str, Any]:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body
    message, code = openai_error_parts(body)
    return {
        "error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "code": code}
    }


# -- streams ------------------------------------------------------------------------------------------------------


class ResponsesStream:
    """Chat chunks in, Responses events out: response.created and in_progress, each output item added, filled
    (text, reasoning text, function arguments) and done in order, then response.completed once the call is
    recorded. Every event carries its sequence_number."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._seq = 0
        self._started = False
        self._response_id = ""
        self._created = 0
        self._model = ""
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._text: list[str] = []
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index
        self._table: ToolTable = tool_table(request)
        self._inputs: dict[int, list[str]] = {}  # output index -> a custom call's arguments text so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(kind, data)

    def _envelope(self, status: str) -> dict[str, Any]:
        return _envelope(self._request, self._response_id, self._created, self._model, status, list(self._items))

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        self._response_id = _response_id(chunk.get("id"))
        self._created = chunk.get("created") if isinstance(chunk.get("created"), int) else int(time.time())
        self._model = chunk.get("model") or ""
        envelope = self._envelope("in_progress")
        return self._event("response.created", response=envelope) + self._event(
            "response.in_progress", response=envelope
        )

    def _add(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._items.append(item)
        self._open = item
        self._text = []
        return out + self._event("response.output_item.added", output_index=len(self._items) - 1, item=dict(item))

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = None
        index = len(self._items) - 1 if item is self._items[-1] else self._items.index(item)
        out = []
        if item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
            item.update(status="completed", content=[part])
        elif item["type"] == "reasoning":
            text = "".join(self._text)
            out.append(
                self._event(
                    "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text
                )
            )
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif item["type"] == "custom_tool_call":
            # The engine streams `{"input": "..."}` as JSON text: the input is known once the call is whole.
            fields = {"item_id": item["id"], "output_index": index}
            item["input"] = custom_input("".join(self._inputs.pop(index, ())))
            if item["input"]:
                out.append(self._event("response.custom_tool_call_input.delta", **fields, delta=item["input"]))
            out.append(self._event("response.custom_tool_call_input.done", **fields, input=item["input"]))
            item["status"] = "completed"
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            )
            item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return b"".join(out)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start(chunk)]
        delta = first_choice(chunk).get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            if self._open is None or self._open["type"] != "reasoning":
                out.append(self._add({"type": "reasoning", "id": _new_id("rs"), "summary": [], "content": []}))
            self._text.append(reasoning)
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self._open["id"],
                    output_index=len(self._items) - 1,
                    content_index=0,
                    delta=reasoning,
                )
            )  # type: ignore[index]
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open is None or self._open["type"] != "message":
                out.append(self._add(_text_item(_new_id("msg"), "", status="in_progress")))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out.append(
                    self._event(
                        "response.content_part.added",
                        item_id=self._open["id"],
                        output_index=len(self._items) - 1,
                        content_index=0,
                        part=part,
                    )
                )  # type: ignore[index]
            self._text.append(text)
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self._open["id"],
                    output_index=len(self._items) - 1,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )  # type: ignore[index]
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            key = call.get("index", 0)
            function = call.get("function") or {}
            if key not in self._calls:
                call_id = call.get("id") or _new_id("call")
                out.append(self._add(self._table.output_item(call_id, function.get("name") or "", "", "in_progress")))
                self._calls[key] = len(self._items) - 1
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                index = self._calls[key]
                item = self._items[index]
                if item["type"] == "custom_tool_call":
                    self._inputs.setdefault(index, []).append(arguments)
                    continue
                item["arguments"] += arguments
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=arguments,
                    )
                )
        return b"".join(out)

    def finish(self, assembled: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start(assembled)]
        out.append(self._close())
        status = _status(first_choice(assembled))
        envelope = self._envelope(status)
        envelope["usage"] = _usage(assembled.get("usage"))
        # response.completed also when the answer was cut (its status says incomplete), as vLLM's own server does:
        # the SDKs' stream helpers (get_final_response) and the Agents SDK wait for response.completed only.
        out.append(self._event("response.completed", response=envelope))
        return b"".join(out)

    def error(self, err: ProxyError) -> bytes:
        message, code = openai_error_parts(err.body())
        return self._event("error", code=code, message=message, param=None)


def warnings(body: dict[str, Any]) -> list[str]:
    return tool_table(body).warnings()


DIALECT = Dialect(
    api=RESPONSES,
    to_chat=to_chat,
    from_chat=from_chat,
    stream=ResponsesStream,
    error_body=error_body,
    warnings=warnings,
    earlier=earlier_id,
    chain=chained,
)
