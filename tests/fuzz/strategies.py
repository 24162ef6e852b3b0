"""Hypothesis strategies: protobuf requests built from their descriptors (well-formed but hostile values), raw
malformed encodings, JSON that is deep or broken, and ids with slashes, NULs and other trouble."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import message as pb_message
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from services import wire

NASTY_IDS = [
    "",
    "ro-1",
    "a/b",
    "../../etc/passwd",
    "x\x00y",
    "*",
    "%2F",
    "é",
    "\U0001f642",
    " ",
    "\n",
    "\u202e",
    "a" * 300,
    "ro-1/attempt/at-1",
]
DEEP_JSON = "[" * 5000 + "]" * 5000
JSON_TROUBLE = ["{", "NaN", "[1,", '{"a": Infinity}', DEEP_JSON, '"\\ud800"', "null", "", "{}" * 1000]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
texts = st.one_of(
    st.sampled_from(NASTY_IDS),
    st.text(max_size=40),
    st.text(max_size=40).map(lambda s: s * 200),  # long
)
json_texts = st.one_of(st.sampled_from(JSON_TROUBLE), json_values.map(json.dumps))

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _interesting_ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, -1, 2, 5, 1000, low, high) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        if kind == FieldDescriptor.TYPE_ENUM:  # known values mostly, unknown ones too (proto3 enums are open)
            known = [v.number for v in field.enum_type.values]
            return st.one_of(st.sampled_from(known), _interesting_ints(low, high))
        return _interesting_ints(low, high)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if kind == FieldDescriptor.TYPE_DOUBLE else 32)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.name.endswith("_json"):
        return json_texts
    return texts


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    return _scalar(field)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(_scalar(key), _value(value, depth), max_size=4)
    if field.is_repeated:
        return st.lists(_value(field, depth), max_size=4 if depth < 2 else 1)
    return _value(field, depth)


def _fill(cls: type[pb_message.Message], values: dict[str, Any]) -> pb_message.Message:
    message = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        try:
            if _is_map(field):
                target = getattr(message, name)
                for k, v in value.items():
                    if isinstance(v, pb_message.Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif field.is_repeated:
                target = getattr(message, name)
                for item in value:
                    if isinstance(item, pb_message.Message):
                        target.add().CopyFrom(item)
                    else:
                        target.append(item)
            elif isinstance(value, pb_message.Message):
                getattr(message, name).CopyFrom(value)
            else:
                setattr(message, name, value)
        except (ValueError, TypeError):  # a value protobuf itself refuses to hold (e.g. a lone surrogate)
            continue
    return message


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[pb_message.Message]:
    """Messages of the type, each field set or not, nested messages down to depth 3."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    optional = {field.name: _field(field, depth) for field in descriptor.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: _fill(cls, values))


def with_invalid_utf8(data: bytes, descriptor: Descriptor) -> bytes:
    """The encoding with one more string field whose bytes are not UTF-8 (what a broken client could send)."""
    strings = [f for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated]
    if not strings:
        return data + b"\xff"
    tag = (strings[0].number << 3) | 2
    return data + wire.varint(tag) + b"\x03\xff\xfe\xc0"
