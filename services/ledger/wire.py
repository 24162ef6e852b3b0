"""Protobuf wire encoding of length-delimited fields, to put stored (already serialized) events into responses
without parsing them first. Concatenated encodings of one message type merge, which is what this relies on."""

from __future__ import annotations

from collections.abc import Iterable


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a submessage, string or bytes) with its tag."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def repeated(number: int, payloads: Iterable[bytes]) -> bytes:
    tag = varint((number << 3) | 2)
    return b"".join(tag + varint(len(p)) + p for p in payloads)
