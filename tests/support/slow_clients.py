"""Clients that connect and never finish a request (the deadlines and connection caps of the proxy, the console and
the operational ports of the ledger and the controller)."""

from __future__ import annotations

import asyncio
import os
import time

import httpx


async def fate(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What the server answered before closing the connection (b"" for a plain close), or None if still open."""
    try:
        return await asyncio.wait_for(reader.read(), seconds)
    except TimeoutError:
        return None
    except ConnectionError:
        return b""


def check_all_closed(fates: list[bytes | None], header_variable: str) -> bytes:
    """Every connection was closed, with 408 at its deadline or 503 above the cap (or displaced: a plain close),
    and a 408 names the variable that sets the deadline; returns one 408 answer."""
    still_open = sum(f is None for f in fates)
    assert still_open == 0, f"{still_open} of {len(fates)} slow connections still open"
    answers = {f.split(b" ", 2)[1] for f in fates if f}
    assert answers <= {b"408", b"503"}, answers
    assert b"408" in answers  # the ones admitted were timed out with a clear answer
    timed_out = next(f for f in fates if f and f.split(b" ", 2)[1] == b"408")
    assert b"request_timeout" in timed_out and header_variable.encode() in timed_out
    return timed_out


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def check_ops_port(pid: int, host: str, port: int, path: str, silent: int = 200, half_heads: int = 20) -> None:
    """An operational port (services/ops_http.py) under `silent` connections that send nothing and `half_heads` that
    send half a request head: the service's threads stay bounded, a real GET of `path` answers at once while they
    are open, and every one of them is closed within the head deadline (408, a 503 above the cap, or displaced)."""
    before = thread_count(pid)
    connections = [await asyncio.open_connection(host, port) for _ in range(silent + half_heads)]
    try:
        for _, writer in connections[:half_heads]:
            writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: a\r\n")
        await asyncio.sleep(0.5)
        during = thread_count(pid)
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=5) as http:
            reply = await http.get(f"http://{host}:{port}{path}")
        answered_s = time.monotonic() - started
        fates = await asyncio.gather(*(fate(reader, 8.0) for reader, _ in connections))
    finally:
        for _, writer in connections:
            writer.close()
    print(f"port {port}: threads {before} -> {during} with {len(connections)} silent connections; GET {path} in "
          f"{answered_s * 1000:.0f} ms")  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert answered_s < 1.0, f"GET {path} took {answered_s:.1f} s with {len(connections)} silent connections open"
    # The port's own threads are fixed (one loop, two handlers); the margin is for the service's other threads.
    assert during - before < 20, f"threads went from {before} to {during} with {len(connections)} connections open"
    still_open = sum(f is None for f in fates)
    assert still_open == 0, f"{still_open} of {len(fates)} silent connections still open after 8 s"
    answers = {f.split(b" ", 2)[1] for f in fates if f}
    assert answers <= {b"408", b"503"}, answers
