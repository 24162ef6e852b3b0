"""The Anthropic Messages API (`POST .../v1/messages`) as chat completions, and chat answers as Messages answers.

Covers what agents on the Anthropic SDK send: a system prompt (text or text blocks), user and assistant turns of
text, image, tool_use and tool_result blocks, custom tools with an input schema, tool_choice, stop sequences,
sampling options, streaming. Thinking blocks the agent sends back are dropped (the engine has its own reasoning
parser); reasoning the engine returns becomes a thinking block. Server tools (web search, code execution), documents
and citations are refused with a 400 that names them. Only the first choice is translated (Messages has no `n`).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from .errors import ProxyError
from .translation import (
    MESSAGES,
    Dialect,
    first_choice,
    openai_error_parts,
    parse_arguments,
    require,
    sse,
)

# Sampling options of vLLM's chat completions an agent may add to a Messages request (the SDK's extra_body).
_VLLM_EXTRAS = ("seed", "min_p", "repetition_penalty", "chat_template_kwargs", "min_tokens")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


# -- request ------------------------------------------------------------------------------------------------------


def _text_blocks(value: Any, where: str) -> str:
    """Text of a string or a list of text blocks."""
    if isinstance(value, str):
        return value
    require(isinstance(value, list), f"`{where}` must be a string or a list of content blocks.")
    texts = []
    for block in value:
        require(isinstance(block, dict), f"`{where}` must hold content block objects.")
        if block.get("type") == "text":
            require(isinstance(block.get("text"), str), f"A text block in `{where}` needs `text`, a string.")
            texts.append(block["text"])
        elif block.get("type") not in ("image",):
            raise ProxyError(
                "invalid_request", f"`{where}` holds a {block.get('type')!r} block, which is not supported."
            )
    return "\n".join(texts)


def _image_url(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    require(isinstance(source, dict), f"An image block in {where} needs a `source` object.")
    if source.get("type") == "base64":
        require(
            isinstance(source.get("data"), str) and isinstance(source.get("media_type"), str),
            f"A base64 image in {where} needs `media_type` and `data`.",
        )
        return f"data:{source['media_type']};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise ProxyError("invalid_request", f"An image in {where} must have a base64 or url source.")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    require(isinstance(call_id, str) and bool(call_id), f"A tool_result block in {where} needs `tool_use_id`.")
    content = block.get("content", "")
    text = _text_blocks(content, f"{where}.content") if content else ""
    if block.get("is_error") and not text:
        text = "error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user_turn(content: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks: tool results become tool messages (first, as they answer the previous turn), the
    rest one user message."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for k, block in enumerate(content):
        place = f"{where}.content[{k}]"
        require(isinstance(block, dict), f"{place} must be a content block object.")
        kind = block.get("type")
        if kind == "tool_result":
            out.append(_tool_result(block, place))
        elif kind == "text":
            require(isinstance(block.get("text"), str), f"{place} needs `text`, a string.")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, place)}})
        else:
            raise ProxyError("invalid_request", f"{place} is a {kind!r} block, which is not supported in user turns.")
    if parts:
        if all(part["type"] == "text" for part in parts):
            out.append({"role": "user", "content": "\n".join(part["text"] for part in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_turn(content: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(content):
        place = f"{where}.content[{k}]"
        require(isinstance(block, dict), f"{place} must be a content block object.")
        kind = block.get("type")
        if kind == "text":
            require(isinstance(block.get("text"), str), f"{place} needs `text`, a string.")
            texts.append(block["text"])
        elif kind == "tool_use":
            require(
                isinstance(block.get("id"), str) and isinstance(block.get("name"), str),
                f"{place} (tool_use) needs `id` and `name`.",
            )
            arguments = orjson.dumps(block.get("input") if block.get("input") is not None else {}).decode()
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise ProxyError(
                "invalid_request", f"{place} is a {kind!r} block, which is not supported in assistant turns."
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    require(isinstance(tools, list), "`tools` must be a list.")
    out = []
    for k, tool in enumerate(tools):
        require(isinstance(tool, dict) and isinstance(tool.get("name"), str), f"tools[{k}] needs `name`.")
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("input_schema"), dict):
            raise ProxyError(
                "invalid_request",
                f"tools[{k}] ({tool['name']}) is not a custom tool with an `input_schema`; server tools are not "
                "supported.",
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    require(isinstance(choice, dict), "`tool_choice` must be an object.")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ProxyError("invalid_request", "`tool_choice.type` must be auto, any, none, or tool (with `name`).")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    max_tokens = body.get("max_tokens")
    require(
        isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
        "`max_tokens` is required and must be a positive integer.",
    )
    turns = body.get("messages")
    require(isinstance(turns, list) and bool(turns), "`messages` must be a non-empty list.")
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "`stream` must be a boolean.")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    for k, turn in enumerate(turns):
        where = f"messages[{k}]"
        require(isinstance(turn, dict), f"{where} must be an object.")
        role, content = turn.get("role"), turn.get("content")
        require(role in ("user", "assistant"), f"{where}.role must be user or assistant.")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        require(isinstance(content, list), f"{where}.content must be a string or a list of content blocks.")
        if role == "user":
            messages.extend(_user_turn(content, where))
        else:
            messages.append(_assistant_turn(content, where))
    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        # A prefill: the answer continues the agent's last assistant text (vLLM's chat options for it).
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
    if body.get("model") is not None:
        chat["model"] = body["model"]
    for name in ("temperature", "top_p", "top_k", *_VLLM_EXTRAS):
        if body.get(name) is not None:
            chat[name] = body[name]
    stops = body.get("stop_sequences")
    if stops is not None:
        require(isinstance(stops, list) and all(isinstance(s, str) for s in stops), "`stop_sequences` must be strings.")
        chat["stop"] = stops
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if body["tool_choice"].get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# -- response -----------------------------------------------------------------------------------------------------


def _stop(choice: dict[str, Any], request: dict[str, Any], tool_used: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat choice's finish reason."""
    finish = choice.get("finish_reason")
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in (request.get("stop_sequences") or ()):
        return "stop_sequence", matched
    return "end_turn", None


def _message_id(chat_id: Any) -> str:
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return f"msg_{uuid.uuid4().hex}"


def _reasoning(message: dict[str, Any]) -> str:
    value = message.get("reasoning_content") or message.get("reasoning")
    return value if isinstance(value, str) else ""


def from_chat(response: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    choice = first_choice(response)
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if _reasoning(message):
        content.append({"type": "thinking", "thinking": _reasoning(message), "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
                "name": function.get("name") or "",
                "input": parse_arguments(function.get("arguments") or ""),
            }
        )
    stop_reason, stop_sequence = _stop(choice, request, bool(message.get("tool_calls")))
    usage = response.get("usage") or {}
    return {
        "id": _message_id(response.get("id")),
        "type": "message",
        "role": "assistant",
        "model": response.get("model") or "",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        },
    }


def error_body(body: dict[str, Any], status: int) -> dict[str, Any]:
    message, _ = openai_error_parts(body)
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- streams ------------------------------------------------------------------------------------------------------


class MessagesStream:
    """Chat chunks in, Messages events out: message_start, content blocks (thinking, text, tool_use) opened,
    filled and stopped in order, then message_delta and message_stop once the call is recorded."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._started = False
        self._index = -1
        self._open: str | None = None
        self._tool_blocks: dict[int, int] = {}
        self._tool_used = False

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        prompt = chunk.get("prompt_token_ids")
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model") or "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt) if isinstance(prompt, list) else 0, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        closed = self._close()
        self._index += 1
        self._open = kind
        return closed + sse(
            "content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block}
        )

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start(chunk)]
        choice = first_choice(chunk)
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            if self._open != "thinking":
                out.append(self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
            out.append(self._delta(self._index, {"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open != "text":
                out.append(self._open_block("text", {"type": "text", "text": ""}))
            out.append(self._delta(self._index, {"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            key = call.get("index", 0)
            function = call.get("function") or {}
            if key not in self._tool_blocks:
                self._tool_used = True
                block = {
                    "type": "tool_use",
                    "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
                    "name": function.get("name") or "",
                    "input": {},
                }
                out.append(self._open_block("tool_use", block))
                self._tool_blocks[key] = self._index
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(self._delta(self._tool_blocks[key], {"type": "input_json_delta", "partial_json": arguments}))
        return b"".join(out)

    def finish(self, assembled: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start(assembled)]
        out.append(self._close())
        choice = first_choice(assembled)
        stop_reason, stop_sequence = _stop(choice, self._request, self._tool_used)
        usage = assembled.get("usage") or {}
        output_tokens = usage.get("completion_tokens") or len(choice.get("token_ids") or ())
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}}
        delta["usage"] = {"input_tokens": usage.get("prompt_tokens") or 0, "output_tokens": output_tokens}
        out.append(sse("message_delta", delta))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, err: ProxyError) -> bytes:
        return sse("error", error_body(err.body(), err.status))


DIALECT = Dialect(api=MESSAGES, to_chat=to_chat, from_chat=from_chat, stream=MessagesStream, error_body=error_body)
