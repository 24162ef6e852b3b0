"""A rollout's events as a structured transcript for the pages (pure: no I/O).

Each model call keeps only the messages that are new since the previous call (the request's messages past
those already shown, then the reply), so a multi-turn conversation reads top to bottom once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services._gen.agl.v1 import event_pb2


@dataclass
class Message:
    role: str
    content: str
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    tool_call_id: str = ""


@dataclass
class Call:
    index: int
    model: str
    version: int
    prompt_tokens: int
    response_tokens: int
    latency_s: float
    http_status: int
    retries: int
    finish_reason: str
    messages: list[Message]
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float] | None


@dataclass
class Item:
    kind: str  # "call", "reward" or "event"
    call: Call | None = None
    value: float | None = None
    detail: str = ""
    event_type: str = ""


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def _message(raw: dict[str, Any]) -> Message:
    calls = []
    for call in raw.get("tool_calls") or []:
        if isinstance(call, dict):
            fn = call.get("function") or {}
            calls.append((str(call.get("id", "")), str(fn.get("name", "?")), str(fn.get("arguments", ""))))
    return Message(str(raw.get("role", "?")), _content(raw.get("content")), calls, str(raw.get("tool_call_id", "")))


def transcript(events: Sequence[event_pb2.Event]) -> list[Item]:
    items: list[Item] = []
    shown = 0
    calls = 0
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "model_request":
            calls += 1
            mr = event.model_request
            messages: list[Message] = []
            request = _loads(mr.request_json)
            listed = request.get("messages") if isinstance(request, dict) else None
            if isinstance(listed, list):
                start = shown if 0 < shown <= len(listed) else 0
                messages += [_message(m) for m in listed[start:] if isinstance(m, dict)]
                shown = len(listed)
            elif isinstance(request, dict) and "prompt" in request:
                messages.append(Message("prompt", _content(request["prompt"])))
            response = _loads(mr.response_json)
            if isinstance(response, dict) and response.get("choices"):
                choice = response["choices"][0]
                if isinstance(choice.get("message"), dict):
                    messages.append(_message(choice["message"]))
                else:
                    messages.append(Message("assistant", str(choice.get("text", ""))))
                shown += 1
            elif mr.response_json:
                messages.append(Message("error", mr.response_json[:2000]))
            call = Call(
                index=calls,
                model=mr.model,
                version=mr.model_version,
                prompt_tokens=mr.usage.prompt_tokens or len(mr.prompt_token_ids),
                response_tokens=mr.usage.completion_tokens or len(mr.response_token_ids),
                latency_s=mr.latency_seconds,
                http_status=mr.http_status,
                retries=mr.retry_count,
                finish_reason=mr.finish_reason,
                messages=messages,
                prompt_token_ids=list(mr.prompt_token_ids),
                response_token_ids=list(mr.response_token_ids),
                logprobs=[round(x, 4) for x in mr.response_logprobs] if mr.has_response_logprobs else None,
            )
            items.append(Item("call", call=call))
        elif kind == "reward":
            reward = event.reward
            detail = ", ".join(x for x in (reward.source, reward.reason, reward.message) if x)
            items.append(Item("reward", value=reward.value, detail=detail))
        else:
            items.append(
                Item("event", detail=event.data_json if kind == "data_json" else "", event_type=event.event_type)
            )
    return items


def reward_of(events: Sequence[event_pb2.Event]) -> float | None:
    value = None
    for event in events:
        if event.WhichOneof("payload") == "reward":
            value = event.reward.value
    return value
