"""Protobuf wire encoding of length-delimited fields, to put stored (already serialized) events into responses
without parsing them first, and a field scanner to cut serialized events apart (the triplet view). Concatenated
encodings of one message type merge, which is what this relies on.

Beside the generated code because it belongs to the contract, not to a service: the ledger and the client both
use it. Field numbers are never written here or by its callers; `number` reads them from the generated
descriptors, so a renumbered field in the protos changes the fast paths with it."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

# (field number, wire type, start of the field (its tag), start of its value, end). For a length-delimited field
# the value span excludes the length prefix.
Field = tuple[int, int, int, int, int]

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5


def number(message: type[Message], name: str) -> int:
    """The field number of `name` in `message`, from its descriptor (KeyError naming the field when absent)."""
    fields = message.DESCRIPTOR.fields_by_name
    if name not in fields:
        raise KeyError(f"{message.DESCRIPTOR.full_name} has no field {name!r}")
    return fields[name].number


def varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value] if value >= 0 else varint(value & 0xFFFFFFFFFFFFFFFF)
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a submessage, string or bytes) with its tag."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def repeated(number: int, payloads: Iterable[bytes]) -> bytes:
    tag = varint((number << 3) | 2)
    parts: list[bytes] = []
    for payload in payloads:
        parts += (tag, varint(len(payload)), payload)
    return b"".join(parts)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it (IndexError when the buffer ends inside it)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def scan(buf: bytes, pos: int = 0, end: int = -1) -> list[Field]:
    """The fields of the message encoded in buf[pos:end], in encoding order.

    Raises ValueError (or IndexError) for what is not a well-formed encoding, groups included (proto3 has none).
    """
    if end < 0:
        end = len(buf)
    out: list[Field] = []
    while pos < end:
        start = pos
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos)
        kind = key & 7
        if kind == LEN:
            size = buf[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = read_varint(buf, pos)
            value = pos
            pos += size
        elif kind == VARINT:
            value = pos
            while buf[pos] >= 0x80:
                pos += 1
            pos += 1
        elif kind == FIXED64:
            value = pos
            pos += 8
        elif kind == FIXED32:
            value = pos
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {kind}")
        if key >> 3 == 0:
            raise ValueError("field number 0")
        out.append((key >> 3, kind, start, value, pos))
    if pos != end:
        raise ValueError("message ends inside a field")
    return out
