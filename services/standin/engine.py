"""Turns an OpenAI request into vLLM-shaped response bodies and stream chunks (return_token_ids included).

Field names follow vLLM's OpenAI server: chat responses carry top-level `prompt_token_ids` and per-choice
`token_ids`; completions carry both per choice; chat log-probs are `choices[].logprobs.content[]` entries of
{token, logprob, bytes, top_logprobs}; completion log-probs are {tokens, token_logprobs, top_logprobs, text_offset};
stream chunks carry the token ids of their own delta.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import model
from .tokenizer import ToyTokenizer, alternatives, token_logprob

MAX_TOP_LOGPROBS = 20
MAX_MODEL_LEN = 32768


class EngineError(Exception):
    """A request the engine refuses, answered like vLLM's ErrorResponse."""

    def __init__(self, status: int, message: str, error_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status}}


@dataclass
class Choice:
    index: int
    token_ids: list[int]
    pieces: list[str]
    finish_reason: str
    text: str = ""
    tool_calls: list[model.ToolCall] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)


@dataclass
class Generation:
    api: str  # "chat" or "completions"
    request_id: str
    created: int
    model: str
    choices: list[Choice]
    prompt_token_ids: list[int]
    return_token_ids: bool
    logprobs: bool
    top_logprobs: int
    prompt_tokens: int

    def usage(self) -> dict[str, Any]:
        completion = sum(len(choice.token_ids) for choice in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }


def _int_field(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f" and at most {high}" if high is not None else ""
        raise EngineError(400, f"`{name}` must be an integer of at least {low}{bound}.", param=name)
    return value


def _check_common(body: dict[str, Any], served_model: str) -> None:
    requested = body.get("model")
    if requested is not None and requested != served_model:
        raise EngineError(404, f"The model `{requested}` does not exist.", "NotFoundError", "model")
    if body.get("stream_options") and not body.get("stream"):
        raise EngineError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
        raise EngineError(400, "`temperature` must be a number.", param="temperature")


def _fit_context(max_tokens: int | None, param: str, prompt_tokens: int, max_model_len: int) -> int:
    """The output limit vLLM (0.32) applies: a limit above max_model_len and a prompt longer than it are refused
    (vLLM's messages), any other limit is lowered to what the prompt leaves (vLLM's get_max_tokens)."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise EngineError(
            400,
            f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param=param,
        )
    if prompt_tokens > max_model_len:
        raise EngineError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.",
            param="input_tokens",
        )
    room = max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


def _truncate(pieces: list[str], max_tokens: int | None, stop: Any) -> tuple[list[str], str | None]:
    """Applies stop strings and max_tokens; returns the kept pieces and the finish reason if cut."""
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str) and s]
    text = ""
    for position, piece in enumerate(pieces):
        if any(s in text + piece for s in stops):
            return pieces[:position], "stop"
        text += piece
    if max_tokens is not None and len(pieces) > max_tokens:
        return pieces[:max_tokens], "length"
    return pieces, None


def _sample_mistake(body: dict[str, Any], mistake_rate: float) -> bool:
    """Whether this answer is a deliberate mistake: only when sampling (temperature > 0), reproducible with `seed`."""
    temperature = body.get("temperature", 1.0)
    if mistake_rate <= 0 or not temperature:
        return False
    seed = body.get("seed")
    rng = random.Random(seed) if isinstance(seed, int) and not isinstance(seed, bool) else random
    return rng.random() < mistake_rate


def generate_chat(
    body: dict[str, Any],
    served_model: str,
    tokenizer: ToyTokenizer,
    mistake_rate: float = 0.0,
    max_model_len: int = MAX_MODEL_LEN,
) -> Generation:
    _check_common(body, served_model)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise EngineError(400, "`messages` must be a non-empty list of message objects.", param="messages")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise EngineError(400, "`logprobs` must be a boolean.", param="logprobs")
    top = _int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    max_tokens, param = _int_field(body, "max_completion_tokens", 0), "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = _int_field(body, "max_tokens", 0), "max_tokens"
    n = _int_field(body, "n", 1) or 1
    tools = body.get("tools")
    prompt_ids = tokenizer.encode(model.render_chat(messages, tools))
    knobs = body.get("standin") if isinstance(body.get("standin"), dict) else {}
    mistake = _sample_mistake(body, mistake_rate)
    reply = model.chat_reply(messages, tools, body.get("tool_choice", "auto"), mistake, knobs)
    all_pieces = tokenizer.split(reply.raw)
    limit = _fit_context(max_tokens, param, len(prompt_ids), max_model_len)
    pieces, cut = _truncate(all_pieces, limit, body.get("stop"))
    choices = []
    for index in range(n):
        choice = Choice(index=index, token_ids=[tokenizer.token_id(p) for p in pieces], pieces=pieces, finish_reason="")
        if cut is None and reply.tool_calls:
            choice.tool_calls, choice.finish_reason = reply.tool_calls, "tool_calls"
        else:
            choice.text, choice.finish_reason = "".join(pieces), cut or "stop"
        choices.append(choice)
    return Generation(
        api="chat",
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=served_model,
        choices=choices,
        prompt_token_ids=prompt_ids,
        return_token_ids=bool(body.get("return_token_ids")),
        logprobs=logprobs,
        top_logprobs=top,
        prompt_tokens=len(prompt_ids),
    )


def _prompts(prompt: Any, tokenizer: ToyTokenizer) -> list[tuple[str, list[int]]]:
    if isinstance(prompt, str) and prompt:
        return [(prompt, tokenizer.encode(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [("".join(tokenizer.decode_piece(t) for t in prompt), list(prompt))]
        if all(isinstance(p, str | list) for p in prompt):
            return [item for p in prompt for item in _prompts(p, tokenizer)]
    raise EngineError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")


def generate_completion(
    body: dict[str, Any],
    served_model: str,
    tokenizer: ToyTokenizer,
    mistake_rate: float = 0.0,
    max_model_len: int = MAX_MODEL_LEN,
) -> Generation:
    _check_common(body, served_model)
    prompts = _prompts(body.get("prompt"), tokenizer)
    logprobs = _int_field(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    max_tokens = _int_field(body, "max_tokens", 0)
    max_tokens = 16 if max_tokens is None else max_tokens  # vLLM's default for completions
    n = _int_field(body, "n", 1) or 1
    choices = []
    for prompt_index, (text, prompt_ids) in enumerate(prompts):
        reply = model.completion_reply(text, _sample_mistake(body, mistake_rate))
        limit = _fit_context(max_tokens, "max_tokens", len(prompt_ids), max_model_len)
        pieces, cut = _truncate(tokenizer.split(reply), limit, body.get("stop"))
        for i in range(n):
            choices.append(
                Choice(
                    index=prompt_index * n + i,
                    token_ids=[tokenizer.token_id(p) for p in pieces],
                    pieces=pieces,
                    finish_reason=cut or "stop",
                    text="".join(pieces),
                    prompt_token_ids=prompt_ids,
                )
            )
    return Generation(
        api="completions",
        request_id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=served_model,
        choices=choices,
        prompt_token_ids=[],
        return_token_ids=bool(body.get("return_token_ids")),
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        prompt_tokens=sum(len(ids) for _, ids in prompts) * n,
    )


# -- log-prob blocks ---------------------------------------------------------------------------------------------


def _chat_logprob_entries(gen: Generation, tokenizer: ToyTokenizer, ids: list[int], start: int) -> list[dict]:
    entries = []
    for offset, token in enumerate(ids):
        position = start + offset
        piece = tokenizer.decode_piece(token)
        lp = token_logprob(token, position)
        top = []
        if gen.top_logprobs:
            top.append({"token": piece, "logprob": lp, "bytes": list(piece.encode())})
            for alt, alt_lp in alternatives(token, position, gen.top_logprobs - 1):
                alt_piece = tokenizer.decode_piece(alt)
                top.append({"token": alt_piece, "logprob": alt_lp, "bytes": list(alt_piece.encode())})
        entries.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": top})
    return entries


def _completion_logprobs(gen: Generation, tokenizer: ToyTokenizer, ids: list[int], start: int, offset: int) -> dict:
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for k, token in enumerate(ids):
        position = start + k
        piece = tokenizer.decode_piece(token)
        lp = token_logprob(token, position)
        tokens.append(piece)
        token_logprobs.append(lp)
        entry = {piece: lp}
        for alt, alt_lp in alternatives(token, position, gen.top_logprobs):
            entry.setdefault(tokenizer.decode_piece(alt), alt_lp)
        top.append(entry)
        text_offset.append(offset)
        offset += len(piece)
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top}


def _tool_call_json(call: model.ToolCall) -> dict[str, Any]:
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


# -- full responses ----------------------------------------------------------------------------------------------


def full_body(gen: Generation, tokenizer: ToyTokenizer) -> dict[str, Any]:
    choices = []
    for choice in gen.choices:
        if gen.api == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": choice.text if not choice.tool_calls else None}
            message["reasoning_content"] = None
            if choice.tool_calls:
                message["tool_calls"] = [_tool_call_json(call) for call in choice.tool_calls]
            item: dict[str, Any] = {"index": choice.index, "message": message}
            item["logprobs"] = (
                {"content": _chat_logprob_entries(gen, tokenizer, choice.token_ids, 0)} if gen.logprobs else None
            )
        else:
            item = {"index": choice.index, "text": choice.text}
            item["logprobs"] = _completion_logprobs(gen, tokenizer, choice.token_ids, 0, 0) if gen.logprobs else None
        item["finish_reason"] = choice.finish_reason
        item["stop_reason"] = None
        item["token_ids"] = choice.token_ids if gen.return_token_ids else None
        if gen.api == "completions":
            item["prompt_logprobs"] = None
            item["prompt_token_ids"] = choice.prompt_token_ids if gen.return_token_ids else None
        choices.append(item)
    body: dict[str, Any] = {
        "id": gen.request_id,
        "object": "chat.completion" if gen.api == "chat" else "text_completion",
        "created": gen.created,
        "model": gen.model,
        "choices": choices,
        "usage": gen.usage(),
    }
    if gen.api == "chat":
        body["prompt_logprobs"] = None
        body["prompt_token_ids"] = gen.prompt_token_ids if gen.return_token_ids else None
    return body


# -- streams -----------------------------------------------------------------------------------------------------


def _chunk(gen: Generation, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if gen.api == "chat" else "text_completion"
    return {"id": gen.request_id, "object": obj, "created": gen.created, "model": gen.model, "choices": choices}


def _chat_stream(gen: Generation, tokenizer: ToyTokenizer) -> Iterator[dict[str, Any]]:
    for choice in gen.choices:
        first = _chunk(gen, [{"index": choice.index, "delta": {"role": "assistant", "content": ""}}])
        first["choices"][0].update(logprobs=None, finish_reason=None)
        if gen.return_token_ids:
            first["prompt_token_ids"] = gen.prompt_token_ids
        yield first
        if choice.tool_calls:
            half = len(choice.token_ids) // 2
            call = choice.tool_calls[0]
            head = {
                "index": 0,
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            deltas = [
                ({"tool_calls": [head]}, choice.token_ids[:half], 0),
                (
                    {"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]},
                    choice.token_ids[half:],
                    half,
                ),
            ]
        else:
            deltas = [
                ({"content": piece}, [token], k)
                for k, (piece, token) in enumerate(zip(choice.pieces, choice.token_ids, strict=True))
            ]
        if not deltas:
            deltas = [({"content": ""}, [], 0)]
        for k, (delta, ids, start) in enumerate(deltas):
            item: dict[str, Any] = {"index": choice.index, "delta": delta}
            item["logprobs"] = {"content": _chat_logprob_entries(gen, tokenizer, ids, start)} if gen.logprobs else None
            last = k == len(deltas) - 1
            item["finish_reason"] = choice.finish_reason if last else None
            if last:
                item["stop_reason"] = None
            if gen.return_token_ids:
                item["token_ids"] = ids
            yield _chunk(gen, [item])


def _completion_stream(gen: Generation, tokenizer: ToyTokenizer) -> Iterator[dict[str, Any]]:
    for choice in gen.choices:
        pairs = list(zip(choice.pieces, choice.token_ids, strict=True)) or [("", None)]
        offset = 0
        for k, (piece, token) in enumerate(pairs):
            ids = [token] if token is not None else []
            item: dict[str, Any] = {"index": choice.index, "text": piece}
            item["logprobs"] = _completion_logprobs(gen, tokenizer, ids, k, offset) if gen.logprobs else None
            offset += len(piece)
            last = k == len(pairs) - 1
            item["finish_reason"] = choice.finish_reason if last else None
            item["stop_reason"] = None
            if gen.return_token_ids:
                if k == 0:
                    item["prompt_token_ids"] = choice.prompt_token_ids
                item["token_ids"] = ids
            yield _chunk(gen, [item])


def stream_chunks(gen: Generation, tokenizer: ToyTokenizer, include_usage: bool) -> Iterator[dict[str, Any]]:
    yield from _chat_stream(gen, tokenizer) if gen.api == "chat" else _completion_stream(gen, tokenizer)
    if include_usage:
        final = _chunk(gen, [])
        final["usage"] = gen.usage()
        yield final
