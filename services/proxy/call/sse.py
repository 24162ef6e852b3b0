"""Server-sent events: split an upstream byte stream into whole events without re-encoding them."""

from __future__ import annotations

from dataclasses import dataclass

DONE = b"[DONE]"


@dataclass(frozen=True)
class SSEvent:
    raw: bytes  # the event as received, with its blank-line terminator
    data: bytes | None  # the joined data lines, or None for an event without data (a comment, a ping)


class SSESplitter:
    """Feed bytes as they arrive; get back the events completed so far."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEvent]:
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events = []
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            events.append(self._event(buffer[start : end + 2]))
            start = end + 2
        self._buffer = buffer[start:]
        return events

    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (left over when the stream ends)."""
        return self._buffer

    @staticmethod
    def _event(raw: bytes) -> SSEvent:
        lines = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
        return SSEvent(raw=raw, data=b"\n".join(lines) if lines else None)
