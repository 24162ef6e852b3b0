"""A stand-in for the network between a client and a server on loopback: a TCP relay that can lose an answer.

`silence_after(marker)` arms it: the first client -> server chunk that contains `marker` is delivered, then
nothing more comes back on any connection; `cut(down_s)`, once the caller has seen the server apply the request,
closes every connection and refuses new ones for `down_s` seconds. That is a server that went away right after it
committed a request, before its answer left: the client sees UNAVAILABLE for a call that took effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator


class CuttingRelay:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._marker: bytes | None = None
        self._silent = False  # after the marked request: nothing flows back
        self._refuse_until = 0.0
        self.cuts = 0
        self.address = ""

    def silence_after(self, marker: bytes) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_marker", marker)

    def cut(self, down_s: float) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(down_s), self._loop).result(10)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                if not upstream and self._silent:
                    continue  # the answer is lost
                writer.write(chunk)
                await writer.drain()
                if upstream and self._marker is not None and self._marker in chunk:
                    self._marker = None
                    self._silent = True
        writer.close()

    async def _cut(self, down_s: float) -> None:
        self._refuse_until = time.monotonic() + down_s
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        self._silent = False
        self.cuts += 1

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until or self._silent:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer, True), self._pump(up_reader, writer, False))
        self._writers.difference_update((writer, up_writer))

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"


@contextlib.contextmanager
def cutting_relay(target: str) -> Iterator[CuttingRelay]:
    """The relay to `target` (host:port) on a free loopback port, served from a thread of its own."""
    relay = CuttingRelay(target)
    thread = threading.Thread(target=relay._loop.run_forever, name="relay", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(relay._start(), relay._loop).result(10)
    try:
        yield relay
    finally:

        async def close() -> None:
            if relay._server is not None:
                relay._server.close()
            for writer in list(relay._writers):
                writer.close()

        asyncio.run_coroutine_threadsafe(close(), relay._loop).result(10)
        relay._loop.call_soon_threadsafe(relay._loop.stop)
        thread.join(10)
        relay._loop.close()
