"""Clients that connect and never finish a request (the proxy's and the console's deadlines and connection cap)."""

from __future__ import annotations

import asyncio


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
