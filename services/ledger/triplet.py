"""The triplet view: events trimmed to what training needs, one call per distinct prompt.

model_request keeps prompt/response token ids, response log-probs, model, version, status, finish reason and its
tool-call counts;
reward keeps value, source and reason; other events are left out. Of calls with an identical prompt-token
sequence only the last is kept (a retried or repeated call must not enter the batch twice). Log-probs that do
not line up with the response tokens, or are not finite, are dropped (has_response_logprobs false): never an
error.

The trimming happens once, when an event is appended: `split` re-encodes the serialized event as its triplet
form followed by the rest, at the wire level (no parsing into messages). Parsing that still gives the event
(protobuf merges concatenated encodings of a message, and the two parts hold disjoint fields), so stores keep
it in place of the event, with the length of the triplet form: the view costs no memory. Reading the view
(`view`) then only slices stored bytes and compares prompt bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from services._gen.agl.v1 import event_pb2

from . import wire
from .validation import MODEL_REQUEST, REWARD

_MODEL_REQUEST_TYPE = MODEL_REQUEST.encode()
_REWARD_TYPE = REWARD.encode()

# Event: fields 1-6 (ids, sequence, type, time) go with the trimmed form; 10 model_request, 11 reward, 12 data_json.
_HEADER_LAST = 6
_MODEL_REQUEST, _REWARD, _DATA_JSON = 10, 11, 12
# ModelRequest: 3 prompt and 4 response token ids, 5 log-probs (packed), 6 has_response_logprobs.
_PROMPT = 3
_REWARD_KNOWN = frozenset(range(1, 6))

_HIGH_BYTES = bytes(range(0x80, 0x100))
_PROMPT_TAG = (_PROMPT << 3) | wire.LEN
_MODEL_REQUEST_TAG = (_MODEL_REQUEST << 3) | wire.LEN


class _Unusual(Exception):
    """The encoding is not the canonical one the fast path expects (the slow path handles it)."""


# -- cutting an event at append time -----------------------------------------------------------------------------


def split(data: bytes) -> tuple[bytes, int]:
    """(stored, cut) for a serialized event: `stored` encodes the same event, with its triplet form first:
    stored[:cut] is the triplet form (cut 0 when the view leaves the event out; stored is then `data`), and
    stored[cut:] the fields the view drops.

    The fast path cuts canonical encodings (what SerializeToString produces: known fields in field-number order)
    at the wire level; anything else (unknown fields, say) goes through parsed messages.
    """
    try:
        return _split_wire(data)
    except (_Unusual, ValueError, IndexError):
        return _split_messages(data)


def _split_wire(data: bytes) -> tuple[bytes, int]:
    # Header fields (1-6, one-byte tags) and then, last, the payload. Wire types: 3 (sequence) is a varint, the
    # rest length-delimited; anything else is not a canonical Event and takes the slow path.
    pos, end, last = 0, len(data), 0
    event_type = b""
    while pos < end:
        tag = data[pos]
        number = tag >> 3
        if tag >= 0x80 or number <= last or _HEADER_LAST < number < _MODEL_REQUEST or number > _DATA_JSON:
            raise _Unusual  # out of order or unknown
        last = number
        if tag & 7 == 0:  # the sequence
            pos += 1
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
            continue
        if tag & 7 != 2:
            raise _Unusual
        size = data[pos + 1]
        value = pos + 2
        if size >= 0x80:
            size, value = wire.read_varint(data, pos + 1)
        if number > _HEADER_LAST:
            if value + size != end:
                raise _Unusual  # the payload is not last
            if number == _MODEL_REQUEST and event_type == _MODEL_REQUEST_TYPE:
                kept, dropped = _cut_model_request(data, value, end)
            elif number == _REWARD and event_type == _REWARD_TYPE:
                kept, dropped = _cut_reward(data, value, end)
            else:
                return data, 0
            head = bytes((tag,))
            parts = [head, _size(len(kept)), kept, data[:pos]]  # the triplet form, payload first (see prompt_key)
            cut = sum(map(len, parts))
            if dropped:
                parts += (head, _size(len(dropped)), dropped)
            return b"".join(parts), cut
        if number == 4:
            event_type = data[value : value + size]
        pos = value + size
    if pos != end:
        raise ValueError("event ends inside a field")
    return data, 0  # no payload


def _size(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    return bytes(((n & 0x7F) | 0x80, n >> 7)) if n < 0x4000 else wire.varint(n)


# ModelRequest fields in canonical order run: [1-2 dropped][3-4 kept][5-6 kept when usable][7-8 kept][9-13 dropped]
# [14-15 kept][16-17 dropped][18 kept]. The cut records where each run starts: _MR_RUN[number] is the run field
# `number` belongs to.
_MR_RUN = (0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4, 4, 5, 5, 6, 6, 7)
_MR_RUNS = 8
_MR_LAST = 18


def _cut_model_request(data: bytes, pos: int, end: int) -> tuple[bytes, bytes]:
    # The hot loop of every append: field numbers are literals here (4 response ids, 5 log-probs, 6 their flag).
    runs: list[int] = [end] * (_MR_RUNS + 1)  # where each run starts (a run's end is the next one's start)
    runs[0] = pos
    run = last = 0
    response_start = response_end = logprobs_start = logprobs_end = 0
    has_logprobs = False
    run_of = _MR_RUN
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            value = pos + 1
        else:
            tag, value = wire.read_varint(data, pos)
            if tag >> 3 > _MR_LAST:
                raise _Unusual  # unknown
        number = tag >> 3
        if number <= last:
            raise _Unusual  # out of order
        last = number
        if run_of[number] != run:
            while run < run_of[number]:  # a skipped (absent) run is empty: it starts where this field does
                run += 1
                runs[run] = pos
        kind = tag & 7
        if kind == 2:
            size = data[value]
            if size < 0x80:
                value += 1
            elif data[value + 1] < 0x80:
                size = (size & 0x7F) | (data[value + 1] << 7)
                value += 2
            else:
                size, value = wire.read_varint(data, value)
            pos = value + size
            if number == 4:
                response_start, response_end = value, pos
            elif number == 5:
                logprobs_start, logprobs_end = value, pos
        elif kind == 0:
            if number == 6:
                has_logprobs = data[value] != 0
            elif 3 <= number <= 5:  # packed fields sent unpacked
                raise _Unusual
            pos = value
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
        elif kind == 1 and not 3 <= number <= 5:
            pos = value + 8
        elif kind == 5 and not 3 <= number <= 5:
            pos = value + 4
        else:
            raise _Unusual
    if pos != end:
        raise ValueError("model_request ends inside a field")
    begin, run3, run5, run7, run9, run14, run16, run18, _ = runs
    if has_logprobs and _finite_and_aligned(data, logprobs_start, logprobs_end, response_start, response_end):
        kept = (data[run3:run9], data[run14:run16], data[run18:end])
        dropped = (data[begin:run3], data[run9:run14], data[run16:run18])
    else:
        kept = (data[run3:run5], data[run7:run9], data[run14:run16], data[run18:end])
        dropped = (data[begin:run3], data[run5:run7], data[run9:run14], data[run16:run18])
    return b"".join(kept), b"".join(dropped)


def _finite_and_aligned(data: bytes, lp_start: int, lp_end: int, ids_start: int, ids_end: int) -> bool:
    """Packed doubles data[lp_start:lp_end], as many as the packed varints data[ids_start:ids_end] (one byte below
    0x80 ends each), all finite."""
    count = len(data[ids_start:ids_end].translate(None, _HIGH_BYTES))
    if lp_end - lp_start != 8 * count:
        return False
    # A NaN or an infinity has all exponent bits set, so the top byte of its (little-endian) encoding is 0x7F or
    # 0xFF. Log-probs are small negative numbers: only when some top byte is one of those is a closer look due.
    top = data[lp_start + 7 : lp_end : 8]
    if b"\x7f" not in top and b"\xff" not in top:
        return True
    return all(map(math.isfinite, struct.unpack_from(f"<{count}d", data, lp_start)))


# Reward fields in canonical order run: [1 kept][2 dropped][3-4 kept][5 dropped].
_REWARD_RUNS = (2, 3, 5)


def _cut_reward(data: bytes, start: int, end: int) -> tuple[bytes, bytes]:
    bounds = [end] * len(_REWARD_RUNS)
    run = last = 0
    for number, _kind, field_start, _value, _end in wire.scan(data, start, end):
        if number <= last or number not in _REWARD_KNOWN:
            raise _Unusual
        last = number
        while run < len(_REWARD_RUNS) and number >= _REWARD_RUNS[run]:
            bounds[run] = field_start
            run += 1
    run2, run3, run5 = bounds
    return data[start:run2] + data[run3:run5], data[run2:run3] + data[run5:end]


def _split_messages(data: bytes) -> tuple[bytes, int]:
    """The slow path of `split`, through parsed messages."""
    event = event_pb2.Event.FromString(data)
    trimmed = trim(event)
    if trimmed is None:
        return data, 0
    rest = event_pb2.Event()
    rest.CopyFrom(event)
    for name in ("rollout_id", "attempt_id", "sequence", "event_type", "create_time", "event_id"):
        rest.ClearField(name)
    if trimmed.HasField("model_request"):
        names = ["prompt_token_ids", "response_token_ids", "model", "model_version", "finish_reason", "status"]
        names.append("tool_calls")
        if trimmed.model_request.has_response_logprobs:
            names += ["response_logprobs", "has_response_logprobs"]
        payload = rest.model_request
    else:
        names = ["value", "source", "reason"]
        payload = rest.reward
    for name in names:
        payload.ClearField(name)
    kind = trimmed.WhichOneof("payload")
    kept = wire.field(trimmed.DESCRIPTOR.fields_by_name[kind].number, getattr(trimmed, kind).SerializeToString())
    trimmed.ClearField(kind)
    cut = kept + trimmed.SerializeToString()
    return cut + rest.SerializeToString(), len(cut)


def _logprobs_ok(mr: event_pb2.ModelRequest) -> bool:
    logprobs = mr.response_logprobs
    if not mr.has_response_logprobs or len(logprobs) != len(mr.response_token_ids):
        return False
    return all(math.isfinite(x) for x in logprobs)


def trim(event: event_pb2.Event) -> event_pb2.Event | None:
    """The triplet form of one event as a message, or None when the view leaves it out (the reference the wire
    path is checked against, and its fallback)."""
    payload = event.WhichOneof("payload")
    out = event_pb2.Event(
        rollout_id=event.rollout_id,
        attempt_id=event.attempt_id,
        sequence=event.sequence,
        event_type=event.event_type,
        event_id=event.event_id,
    )
    if event.HasField("create_time"):
        out.create_time.CopyFrom(event.create_time)
    if event.event_type == MODEL_REQUEST and payload == "model_request":
        src = event.model_request
        dst = out.model_request
        dst.prompt_token_ids.extend(src.prompt_token_ids)
        dst.response_token_ids.extend(src.response_token_ids)
        if _logprobs_ok(src):
            dst.response_logprobs.extend(src.response_logprobs)
            dst.has_response_logprobs = True
        dst.model = src.model
        dst.model_version = src.model_version
        dst.status = src.status
        dst.finish_reason = src.finish_reason
        if src.HasField("tool_calls"):
            dst.tool_calls.CopyFrom(src.tool_calls)
        return out
    if event.event_type == REWARD and payload == "reward":
        src_r = event.reward
        out.reward.value = src_r.value
        out.reward.source = src_r.source
        out.reward.reason = src_r.reason
        return out
    return None


# -- reading the view ---------------------------------------------------------------------------------------------


def prompt_key(triplet: bytes) -> bytes:
    """The packed prompt-token bytes of a model_request's triplet form (equal bytes: equal token sequences).

    `split` writes the payload first (protobuf parsers take fields in any order) and a canonical payload starts
    with the prompt, so the key is found without walking the header.
    """
    if triplet[0] != _MODEL_REQUEST_TAG:
        raise ValueError("not the triplet form of a model_request")
    pos = _skip_size(triplet, 1)
    if _read_size(triplet, 1) == 0 or triplet[pos] != _PROMPT_TAG:
        return b""  # no prompt tokens (an empty payload, or one starting with a later field)
    start = _skip_size(triplet, pos + 1)
    return triplet[start : start + _read_size(triplet, pos + 1)]


def _read_size(buf: bytes, pos: int) -> int:
    size = buf[pos]
    if size < 0x80:
        return size
    if buf[pos + 1] < 0x80:
        return (size & 0x7F) | (buf[pos + 1] << 7)
    return wire.read_varint(buf, pos)[0]


def _skip_size(buf: bytes, pos: int) -> int:
    """The position after the varint at `pos`."""
    while buf[pos] >= 0x80:
        pos += 1
    return pos + 1


def view(rows: list[tuple[int, str, bytes]]) -> list[tuple[int, bytes]]:
    """(sequence, triplet bytes) of the view from the stored (sequence, event_type, triplet) rows of events in it
    (in sequence order): the last call per identical prompt, at its position. Calls without prompt tokens are all
    kept: an empty prompt identifies nothing (validation calls are recorded without token ids)."""
    last_by_prompt: dict[bytes, int] = {}
    calls = unkeyed = 0
    for pos, (_seq, event_type, triplet) in enumerate(rows):
        if event_type == MODEL_REQUEST:
            key = prompt_key(triplet)
            if key:
                last_by_prompt[key] = pos
            else:  # no prompt tokens (a validation call, an engine that returns none): nothing says it is a repeat
                unkeyed += 1
            calls += 1
    if len(last_by_prompt) + unkeyed == calls:
        return [(seq, triplet) for seq, _, triplet in rows]  # no prompt repeats: nothing to drop
    keep = set(last_by_prompt.values())
    return [(seq, triplet) for pos, (seq, event_type, triplet) in enumerate(rows)
            if event_type != MODEL_REQUEST or pos in keep or not prompt_key(triplet)]  # fmt: skip


def triplet_view(events: Iterable[event_pb2.Event]) -> list[event_pb2.Event]:
    """The view of `events` (in sequence order) as messages."""
    rows = [(e.sequence, e.event_type, *split(e.SerializeToString())) for e in events]
    return [event_pb2.Event.FromString(data) for _, data in view([(s, t, d[:c]) for s, t, d, c in rows if c])]
