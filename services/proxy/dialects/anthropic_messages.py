"""The Anthropic Messages API (`POST .../v1/messages`) as chat completions, and chat answers as Messages answers.

Covers what agents on the Anthropic SDK and Claude Code send: a system prompt (text or text blocks), `system` turns
inside `messages`, user and assistant turns of text, image, tool_use and tool_result blocks, custom tools with an
input schema, tool_choice, stop sequences, sampling options, `thinking` (the chat template's reasoning switch),
`output_config.format` (structured output), streaming. Reasoning the engine returns becomes a thinking block, and a
thinking block sent back becomes the assistant message's `reasoning` for the template (redacted thinking is
dropped). Accepted and deliberately without effect here: `cache_control` (top level and on blocks: the engine
caches prefixes by itself), `metadata`, `context_management` (the proxy never edits a history: the rows stay
exact), `output_config.effort`, `thinking.budget_tokens`, and the `anthropic-beta` and `anthropic-version` headers
(docs/reference/agent-apis.md). Server tools (web search, code execution), documents and citations are refused with
a 400 that names them. Only the first choice is translated (Messages has no `n`). `count_tokens` takes the same
translation (to_tokenize).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import orjson

from services.proxy.dialects.translation import (
    MESSAGES,
    Dialect,
    first_choice,
    openai_error_parts,
    parse_arguments,
    require,
    sse,
)
from services.proxy.errors import ProxyError

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
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# A system turn inside `messages` after the conversation began is given to the model as user text in these tags:
# the words Claude Code itself uses when it moves such text out of system turns (its fallback on Anthropic's API).
SYSTEM_REMINDER = "<system-reminder>\n{}\n</system-reminder>"
# `thinking.type` -> the chat template's reasoning switch (chat_template_kwargs.enable_thinking: Qwen3's templates
# and others read it; a template without a switch ignores it).
_THINKING = {"enabled": True, "adaptive": True, "disabled": False}
# vLLM's words for a prompt longer than the model's context, and Anthropic's (Claude Code compacts on these).
_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains (?:at least )?(\d+) "
                       r"input tokens")  # fmt: skip


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
    """An assistant turn; its thinking blocks (the engine's reasoning, handed out as such) become the message's
    `reasoning`, which vLLM gives the chat template (`reasoning_content` too): a template that keeps past reasoning
    (Qwen3's, for the turns of the current agent loop) writes it back where the model wrote it."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
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
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic: never the engine's
        else:
            raise ProxyError(
                "invalid_request", f"{place} is a {kind!r} block, which is not supported in assistant turns."
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if any(reasoning):
        message["reasoning"] = "".join(reasoning)
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


def _object(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    require(value is None or isinstance(value, dict), f"`{name}` must be an object.")
    return value or {}


def _check_accepted(body: dict[str, Any]) -> None:
    """The fields accepted without effect here are at least of their documented types (a 400 naming the field)."""
    metadata = _object(body, "metadata")
    user_id = metadata.get("user_id")
    require(user_id is None or isinstance(user_id, str), "`metadata.user_id` must be a string.")
    cache = _object(body, "cache_control")
    require(not cache or isinstance(cache.get("type"), str), "`cache_control.type` must be a string.")
    edits = _object(body, "context_management").get("edits")
    require(edits is None or isinstance(edits, list), "`context_management.edits` must be a list.")
    effort = _object(body, "output_config").get("effort")
    require(effort is None or isinstance(effort, str), "`output_config.effort` must be a string.")


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """chat_template_kwargs: `thinking` as the template's reasoning switch; the agent's own kwargs win."""
    given = body.get("chat_template_kwargs")
    thinking = body.get("thinking")
    if thinking is None:
        return given
    require(isinstance(thinking, dict), "`thinking` must be an object.")
    kind = thinking.get("type")
    require(kind in _THINKING, "`thinking.type` must be enabled, adaptive or disabled.")
    budget = thinking.get("budget_tokens")
    require(
        (budget is None and kind != "enabled")
        or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1),
        "`thinking.budget_tokens` must be a positive integer (required when `thinking.type` is enabled).",
    )
    if given is not None and not isinstance(given, dict):
        return given  # the engine's 400 names it
    return {"enable_thinking": _THINKING[kind], **(given or {})}


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`output_config.format` (Anthropic's structured output) as the chat `response_format` vLLM constrains to."""
    output_format = _object(body, "output_config").get("format")
    if output_format is None:
        return None
    require(
        isinstance(output_format, dict)
        and output_format.get("type") == "json_schema"
        and isinstance(output_format.get("schema"), dict),
        '`output_config.format` must be {"type": "json_schema", "schema": {...}}.',
    )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": output_format["schema"]}}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as chat messages. System turns inside `messages` before the first user or assistant turn join
    the system prompt (which comes first in every rendering); later ones become user text in <system-reminder> tags:
    every chat template takes a user turn, while templates expect at most one system message, at the start (some
    refuse others, some repeat the tool list in each), and moving later text into the system prompt would change the
    start of the prompt that the model's earlier turns were sampled after (a break in every row)."""
    turns = body.get("messages")
    require(isinstance(turns, list) and bool(turns), "`messages` must be a non-empty list.")
    system = [_text_blocks(body["system"], "system")] if body.get("system") else []
    messages: list[dict[str, Any]] = []
    for k, turn in enumerate(turns):
        where = f"messages[{k}]"
        require(isinstance(turn, dict), f"{where} must be an object.")
        role, content = turn.get("role"), turn.get("content")
        require(role in ("user", "assistant", "system"), f"{where}.role must be user, assistant or system.")
        if role == "system":
            text = _text_blocks(content, f"{where}.content")
            if messages:
                messages.append({"role": "user", "content": SYSTEM_REMINDER.format(text)})
            else:
                system.append(text)
            continue
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        require(isinstance(content, list), f"{where}.content must be a string or a list of content blocks.")
        if role == "user":
            messages.extend(_user_turn(content, where))
        else:
            messages.append(_assistant_turn(content, where))
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def _prefill(messages: list[dict[str, Any]]) -> bool:
    """Whether the answer continues the agent's last assistant text (vLLM's continue_final_message)."""
    return messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    max_tokens = body.get("max_tokens")
    require(
        isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
        "`max_tokens` is required and must be a positive integer.",
    )
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "`stream` must be a boolean.")
    _check_accepted(body)
    messages = _messages(body)
    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    if _prefill(messages):
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
    if body.get("model") is not None:
        chat["model"] = body["model"]
    for name in ("temperature", "top_p", "top_k", *_VLLM_EXTRAS):
        if body.get(name) is not None:
            chat[name] = body[name]
    kwargs = _template_kwargs(body)
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
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


def to_tokenize(body: dict[str, Any], model: str) -> dict[str, Any]:
    """A count_tokens request as the body of vLLM's POST /tokenize: the prompt a Messages call with these messages,
    system prompt, tools and thinking would render to (max_tokens is not needed)."""
    _check_accepted(body)
    _response_format(body)  # checked; it constrains an answer, not the prompt
    messages = _messages(body)
    request: dict[str, Any] = {"model": model, "messages": messages}
    if _prefill(messages):
        request.update(add_generation_prompt=False, continue_final_message=True)
    if body.get("tools"):
        request["tools"] = _tools(body["tools"])
    kwargs = _template_kwargs(body)
    if kwargs is not None:
        request["chat_template_kwargs"] = kwargs
    return request


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
    """Anthropic's error shape and types; a prompt longer than the model's context in Anthropic's words ("prompt is
    too long: N tokens > M maximum"), which Claude Code answers by compacting its history."""
    message, _ = openai_error_parts(body)
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    too_long = _TOO_LONG.search(message) if status == 400 else None
    if too_long is not None:
        message = f"prompt is too long: {too_long.group(2)} tokens > {too_long.group(1)} maximum"
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
