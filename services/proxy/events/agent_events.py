"""The events an agent posts itself (rewards, its own spans and messages) as ledger events, checked before storing:
a misspelled reward is refused with the right spelling, a `model_request` needs the master key and v1.0's shape."""

from __future__ import annotations

import json
import math
from typing import Any

from services._gen.agl.v1 import event_pb2
from services.proxy.errors import ProxyError
from services.proxy.events.model_request import model_request_fields

REWARD = "reward"
_REWARD_FIELDS = ("value", "message", "source", "reason")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (RecursionError, ValueError):
        raise ProxyError("invalid_event", "The event's `data` is nested too deeply to be stored.") from None


REFUSED_EVENT = "proxy_refused_event"


def refused_event(rollout_id: str, attempt_id: str, err: ProxyError, posted_type: Any) -> event_pb2.Event:
    """The warning stored on a rollout whose agent posted an event the proxy refused (e.g. a misspelled reward), so
    the refusal is seen where people look at the rollout, not only in the agent's own output."""
    data = {"status": err.status, "code": err.kind, "message": err.message}
    if isinstance(posted_type, str):
        data["event_type"] = posted_type[:200]
    return event_pb2.Event(
        rollout_id=rollout_id, attempt_id=attempt_id, event_type=REFUSED_EVENT, data_json=json.dumps(data)
    )


def _near(word: str, target: str) -> bool:
    """Whether `word` is at most one edit (insert, delete, substitute, swap of neighbours) away from `target`."""
    if word == target:
        return True
    if abs(len(word) - len(target)) > 1:
        return False
    if len(word) == len(target):
        diffs = [i for i, (a, b) in enumerate(zip(word, target, strict=True)) if a != b]
        if len(diffs) == 1:
            return True
        i = diffs[0]
        return len(diffs) == 2 and diffs[1] == i + 1 and word[i] == target[i + 1] and word[i + 1] == target[i]
    short, long = (word, target) if len(word) < len(target) else (target, word)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def misspelled_reward(event_type: str) -> bool:
    """An event type that is surely meant as `reward` but is not it (`rewrd`, `Reward`, `rewards`, ` reward`).

    Such an event would be stored as-is and the rollout would finish with no reward (the trainer then fills a
    default): refused instead, with a 422 that names the right spelling. Types further away (`final_reward`,
    `rewind`) are the agent's own and pass through untouched."""
    if event_type == REWARD:
        return False
    normal = "".join(c for c in event_type.lower() if c.isalnum())
    return _near(normal, REWARD)


MODEL_REQUEST = "model_request"


def agent_event(rollout_id: str, attempt_id: str, payload: Any, *, master: bool = False) -> event_pb2.Event:
    """The event for a POST {"event_type": ..., "data": {...}} (422 when it is not acceptable).

    A `model_request` is the record of a model call, the one thing the trainer trains on as sampled tokens: agents
    (per-rollout tokens) cannot post one (403); a master-key writer (an importer, a test) may, in v1.0's shape."""
    if not isinstance(payload, dict):
        raise ProxyError("invalid_event", "The body must be a JSON object with `event_type` and `data`.")
    event_type = payload.get("event_type")
    if not isinstance(event_type, str) or not event_type:
        raise ProxyError("invalid_event", "`event_type` must be a non-empty string.")
    if event_type == MODEL_REQUEST and not master:
        raise ProxyError(
            "forbidden",
            "A model_request event is the proxy's record of a model call: an agent's token cannot post one (the "
            "proxy records the agent's calls itself); writing one needs the master key.",
        )
    if misspelled_reward(event_type):
        raise ProxyError(
            "invalid_event",
            f"`event_type` {event_type!r} looks like a misspelled reward: post"
            ' {"event_type": "reward", "data": {"value": <number>}} (exactly "reward", lower case).',
        )
    data = payload.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):  # v1.0's EventCreate: its readers validate every listed event's data as one
        kind = {list: "an array", str: "a string", bool: "a boolean"}.get(type(data), "a number")
        raise ProxyError("invalid_event", f"`data` must be a JSON object, not {kind}.")
    event = event_pb2.Event(rollout_id=rollout_id, attempt_id=attempt_id, event_type=event_type)
    event_id = payload.get("event_id")
    if event_id is not None:
        if not isinstance(event_id, str):
            raise ProxyError("invalid_event", "`event_id` must be a string.")
        event.event_id = event_id
    if event_type == MODEL_REQUEST:
        event.model_request.CopyFrom(event_pb2.ModelRequest(**model_request_fields(data)))
        return event
    if event_type != REWARD:
        event.data_json = _json_text(data)
        return event
    if not isinstance(data, dict) or not _is_number(data.get("value")):
        raise ProxyError("invalid_event", "A reward needs `data.value`, a finite number.")
    reward = event.reward
    reward.value = float(data["value"])
    for name in _REWARD_FIELDS[1:]:
        if data.get(name) is not None:
            setattr(reward, name, str(data[name]))
    extra = {k: v for k, v in data.items() if k not in _REWARD_FIELDS}
    if extra:
        reward.data_json = _json_text(extra)
    return event
