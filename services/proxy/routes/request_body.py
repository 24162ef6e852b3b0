"""Reading a request's body within a size limit (413 `body_too_large` above it)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from services.proxy.errors import ProxyError


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError("body_too_large", f"The body is larger than the limit of {limit} bytes.")
    # Straight from the ASGI messages rather than through request.stream(): an async generator per call costs
    # more than this loop, and the whole body usually comes in one message.
    chunks = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ProxyError("body_too_large", f"The body is larger than the limit of {limit} bytes.")
        if not message.get("more_body", False):
            return b"".join([*chunks, chunk]) if chunks else chunk
        chunks.append(chunk)
