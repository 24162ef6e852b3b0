"""The triplet view: events trimmed to what training needs, one call per distinct prompt.

model_request keeps prompt/response token ids, response log-probs, model, version, HTTP status, status, finish
reason, its tool-call counts and its role;
reward keeps value, source and reason; other events are left out. Of calls with an identical prompt-token
sequence only the last is kept (a retried or repeated call must not enter the batch twice). Log-probs that do
not line up with the response tokens, or are not finite, are dropped (has_response_logprobs false): never an
error.

Which calls train is split on purpose between here and services/trainer/data/triplets.py: the repeat rule is the
view's contract to every consumer (DESIGN.md's triplet view; grpcurl, v1.0's format=triplet, a user's own trainer),
so it is kept where the view is served; the trainer's rules need what only the trainer has (failed calls feed its
step health, the run's reward fill, the role map's other policies). Moving the repeat rule into the trainer was
measured (the fetch unchanged within noise, trace building +23 us per 10-call rollout) and not kept: it would have
broken the contract for every other consumer.

The trimming happens once, when an event is appended: `split` re-encodes the serialized event as its triplet
form followed by the rest, at the wire level (no parsing into messages). Parsing that still gives the event
(protobuf merges concatenated encodings of a message, and the two parts hold disjoint fields), so stores keep
it in place of the event, with the length of the triplet form: the view costs no memory. Reading the view
(`view`) then only slices stored bytes and compares prompt bytes.

`split` and `view` are the two halves of one wire-level encoding and must agree field by field, so they stay side
by side.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from services import wire
from services._gen.agl.v1 import event_pb2

from .validation import MODEL_REQUEST, REWARD

_MODEL_REQUEST_TYPE = MODEL_REQUEST.encode()
_REWARD_TYPE = REWARD.encode()

# Event: the header fields (ids, sequence, type, time) go with the trimmed form, then one payload of the oneof.
# Numbers come from the descriptors; the scanner relies on every header field numbering below every payload
# field and on the payloads being model_request, reward and data_json in that order, which is checked here.
_EVENT = event_pb2.Event.DESCRIPTOR
_PAYLOAD = [field.number for field in _EVENT.oneofs_by_name["payload"].fields]
_HEADER_FIELDS = [field for field in _EVENT.fields if field.containing_oneof is None]
_HEADER = [field.number for field in _HEADER_FIELDS]
_HEADER_LAST = max(_HEADER)
_MODEL_REQUEST = wire.number(event_pb2.Event, "model_request")
_REWARD = wire.number(event_pb2.Event, "reward")
_DATA_JSON = wire.number(event_pb2.Event, "data_json")
if not (_HEADER_LAST < _MODEL_REQUEST < _REWARD < _DATA_JSON and _PAYLOAD == [_MODEL_REQUEST, _REWARD, _DATA_JSON]):
    raise ImportError(f"agl.v1.Event's field layout changed (header {_HEADER}, payload {_PAYLOAD}): update triplet.py")
_EVENT_TYPE = wire.number(event_pb2.Event, "event_type")
_HEADER_NAMES = tuple(field.name for field in _HEADER_FIELDS)

# What the triplet form keeps, by name: the one list both the wire path (its runs, below) and the message path use.
# http_status: the trainer files an agent that failed on a 502/503/504 as the engine's failure, not its score.
# role: the trainer keeps only its own policy's calls (services/role_map.py).
_MR_KEPT = (
    "prompt_token_ids", "response_token_ids", "model", "model_version", "http_status", "finish_reason", "status",
    "tool_calls", "role",
)  # fmt: skip
_MR_USABLE = ("response_logprobs", "has_response_logprobs")  # kept when the log-probs line up and are finite
_REWARD_KEPT = ("value", "source", "reason")

_PROMPT = wire.number(event_pb2.ModelRequest, "prompt_token_ids")
_RESPONSE_IDS = wire.number(event_pb2.ModelRequest, "response_token_ids")
_LOGPROBS = wire.number(event_pb2.ModelRequest, "response_logprobs")
_HAS_LOGPROBS = wire.number(event_pb2.ModelRequest, "has_response_logprobs")
# The packed fields, which a canonical encoding never sends unpacked.
_PACKED = frozenset((_PROMPT, _RESPONSE_IDS, _LOGPROBS))
_REWARD_KNOWN = frozenset(field.number for field in event_pb2.Reward.DESCRIPTOR.fields)


_Runs = tuple[tuple[int, ...], tuple[str, ...]]


def _runs(message: type, kept: tuple[str, ...], usable: tuple[str, ...] = ()) -> _Runs:
    """Canonical encodings list fields by number, so the fields the view keeps and drops come in runs: the run of
    each field number (index 0 unused) and each run's kind. Numbers must run 1..N without gaps: a gap's number
    would be an unknown field the tables cannot place."""
    fields = sorted(message.DESCRIPTOR.fields, key=lambda field: field.number)
    if [field.number for field in fields] != list(range(1, len(fields) + 1)):
        raise ImportError(f"{message.DESCRIPTOR.full_name}'s field numbers have gaps: update triplet.py")
    run_of, kinds = [0], []
    for field in fields:
        kind = "kept" if field.name in kept else "usable" if field.name in usable else "dropped"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
        run_of.append(len(kinds) - 1)
    return tuple(run_of), tuple(kinds)


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
    # Header fields (one-byte tags) and then, last, the payload. Wire types: the sequence is a varint, the rest
    # length-delimited; anything else is not a canonical Event and takes the slow path.
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
        if number == _EVENT_TYPE:
            event_type = data[value : value + size]
        pos = value + size
    if pos != end:
        raise ValueError("event ends inside a field")
    return data, 0  # no payload


def _size(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    return bytes(((n & 0x7F) | 0x80, n >> 7)) if n < 0x4000 else wire.varint(n)


# ModelRequest fields in canonical order run (today: [1-2 dropped][3-4 kept][5-6 kept when usable][7-8 kept]
# [9-10 dropped][11 kept][12-13 dropped][14-15 kept][16-17 dropped][18 kept][19-22 dropped][23 kept]). The cut records
# where each run starts: _MR_RUN[number] is the run field `number` belongs to. The assembly at the end of
# _cut_model_request is written for this sequence of kinds; a proto change that alters it fails at import rather
# than cutting wrongly.
_MR_RUN, _MR_KINDS = _runs(event_pb2.ModelRequest, _MR_KEPT, _MR_USABLE)
_MR_EXPECTED = (
    "dropped", "kept", "usable", "kept", "dropped", "kept", "dropped", "kept", "dropped", "kept", "dropped", "kept",
)  # fmt: skip
if _MR_KINDS != _MR_EXPECTED:
    raise ImportError(f"agl.v1.ModelRequest's kept/dropped runs changed ({_MR_KINDS}): update triplet.py")
_MR_RUNS = len(_MR_KINDS)
_MR_LAST = len(_MR_RUN) - 1


def _cut_model_request(data: bytes, pos: int, end: int) -> tuple[bytes, bytes]:
    # The hot loop of every append: the field numbers it tests are locals.
    response_ids, logprobs, has_logprobs_field, packed = _RESPONSE_IDS, _LOGPROBS, _HAS_LOGPROBS, _PACKED
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
            if number == response_ids:
                response_start, response_end = value, pos
            elif number == logprobs:
                logprobs_start, logprobs_end = value, pos
        elif kind == 0:
            if number == has_logprobs_field:
                has_logprobs = data[value] != 0
            elif number in packed:  # packed fields sent unpacked
                raise _Unusual
            pos = value
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
        elif kind == 1 and number not in packed:
            pos = value + 8
        elif kind == 5 and number not in packed:
            pos = value + 4
        else:
            raise _Unusual
    if pos != end:
        raise ValueError("model_request ends inside a field")
    begin, run3, run5, run7, run9, run11, run12, run14, run16, run18, run19, run23, _ = runs
    if has_logprobs and _finite_and_aligned(data, logprobs_start, logprobs_end, response_start, response_end):
        kept = (data[run3:run9], data[run11:run12], data[run14:run16], data[run18:run19], data[run23:end])
        dropped = (data[begin:run3], data[run9:run11], data[run12:run14], data[run16:run18], data[run19:run23])
    else:
        kept = (
            data[run3:run5],
            data[run7:run9],
            data[run11:run12],
            data[run14:run16],
            data[run18:run19],
            data[run23:end],
        )
        dropped = (
            data[begin:run3],
            data[run5:run7],
            data[run9:run11],
            data[run12:run14],
            data[run16:run18],
            data[run19:run23],
        )
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


# Reward fields in canonical order run (today: [1 kept][2 dropped][3-4 kept][5 dropped]); _REWARD_RUNS holds the
# first field number of each run after the first.
_REWARD_RUN, _REWARD_KINDS = _runs(event_pb2.Reward, _REWARD_KEPT)
if _REWARD_KINDS != ("kept", "dropped", "kept", "dropped"):
    raise ImportError(f"agl.v1.Reward's kept/dropped runs changed ({_REWARD_KINDS}): update triplet.py")
_REWARD_RUNS = tuple(n for n in range(2, len(_REWARD_RUN)) if _REWARD_RUN[n] != _REWARD_RUN[n - 1])


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
    for name in _HEADER_NAMES:
        rest.ClearField(name)
    if trimmed.HasField("model_request"):
        names = list(_MR_KEPT)
        if trimmed.model_request.has_response_logprobs:
            names += _MR_USABLE
        payload = rest.model_request
    else:
        names = list(_REWARD_KEPT)
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
        dst.http_status = src.http_status
        dst.status = src.status
        dst.finish_reason = src.finish_reason
        if src.HasField("tool_calls"):
            dst.tool_calls.CopyFrom(src.tool_calls)
        dst.role = src.role
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
