"""What an agent's event must be to be stored and read back: text that is Unicode (no lone surrogates, which JSON's
`\\udc80` escapes can carry but no UTF-8 string can hold), and data that v1.0's event listing can write as JSON.

Refused here, an event is a 422 naming the field; anything that got stored anyway (by a master-key writer, or
before these checks) is still listed: `writable` cuts what JSON cannot carry instead of failing the page.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.proxy.errors import ProxyError

# orjson writes at most 254 levels, and v1.0's GET /api/rollouts/{id}/events puts each event's data two levels down
# (a list of event objects): an agent's data may nest this deep.
MAX_DATA_DEPTH = 252
_WRITE_DEPTH = 254
_TOO_DEEP = "(nested too deeply to be written as JSON; stored unchanged)"
_REWARD_TEXT_FIELDS = ("message", "source", "reason")


def _check_text(value: Any, field: str) -> None:
    if not isinstance(value, str):
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = value[err.start : err.end].encode("utf-8", "backslashreplace").decode()
        raise ProxyError(
            "invalid_event", f"{field} holds a lone surrogate ({bad} at position {err.start}), which is not text."
        ) from None


def check_agent_event(body: Any) -> None:
    """422 unless the posted event's type, id, reward texts and data can be stored and read back."""
    if not isinstance(body, dict):
        return  # the shape is agent_events.agent_event's to refuse
    _check_text(body.get("event_type"), "`event_type`")
    _check_text(body.get("event_id"), "`event_id`")
    data = body.get("data")
    if isinstance(data, dict):
        for name in _REWARD_TEXT_FIELDS:
            _check_text(data.get(name), f"`data.{name}`")
    try:
        orjson.dumps([[data]])  # as deep as the listing writes it
    except orjson.JSONEncodeError as err:
        reason = str(err)
        if "ecursion" in reason:
            reason = f"is nested more than {MAX_DATA_DEPTH} levels deep"
        elif "surrogate" in reason:
            reason = "holds a lone surrogate (such as \\udc80), which is not text"
        else:
            reason = f"cannot be written back as JSON ({reason})"
        raise ProxyError("invalid_event", f"The event's `data` {reason}.") from None


def writable(value: Any, room: int = _WRITE_DEPTH) -> Any:
    """`value` with what orjson cannot write replaced: containers deeper than `room` levels by a note, lone
    surrogates by their escape, integers beyond 64 bits by floats (for a page that failed to be written whole)."""
    if isinstance(value, dict):
        if room <= 0:
            return _TOO_DEEP
        return {writable(k, 1) if isinstance(k, str) else k: writable(v, room - 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if room <= 0:
            return _TOO_DEEP
        return [writable(v, room - 1) for v in value]
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return str(value)
    return value
