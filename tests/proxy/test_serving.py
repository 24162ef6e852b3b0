"""CoalescingTransport: the writes of one event-loop step leave as one write, in order; close sends what is pending.

The wrapped transport here records what reaches it (it stands for the socket transport of the event loop); every
proxy test also runs through GuardedHttpToolsProtocol, since the proxy process serves with it.
"""

from __future__ import annotations

import asyncio

from services.http_serving import CoalescingTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5555)}.get(name, default)


def wrapped() -> tuple[CoalescingTransport, RecordingTransport]:
    inner = RecordingTransport()
    return CoalescingTransport(inner, asyncio.get_running_loop()), inner


async def test_writes_of_one_step_go_out_together_after_the_step() -> None:
    transport, inner = wrapped()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(bytearray(b"{}"))
    transport.write(b"")
    assert inner.writes == []  # nothing before the step ends
    assert transport.get_write_buffer_size() == 7 + 40
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    assert transport.get_write_buffer_size() == 7


async def test_writes_of_separate_steps_stay_separate_and_ordered() -> None:
    transport, inner = wrapped()
    for chunk in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
        transport.write(chunk)
        await asyncio.sleep(0)
    transport.writelines([b"a", b"b"])
    await asyncio.sleep(0)
    assert inner.writes == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n", b"ab"]


async def test_close_sends_what_is_pending_first() -> None:
    transport, inner = wrapped()
    transport.write(b"head")
    transport.write(b"body")
    transport.close()
    assert inner.writes == [b"headbody"] and inner.closed and transport.is_closing()
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert inner.writes == [b"headbody"]


async def test_abort_drops_what_is_pending_and_late_writes_are_dropped() -> None:
    transport, inner = wrapped()
    transport.write(b"lost")
    transport.abort()
    await asyncio.sleep(0)
    assert inner.writes == [] and inner.aborted
    transport.write(b"after the close")
    await asyncio.sleep(0)
    assert inner.writes == []


async def test_everything_else_is_the_wrapped_transport() -> None:
    transport, _ = wrapped()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 5555)
    assert transport.get_extra_info("sockname", "none") == "none"
