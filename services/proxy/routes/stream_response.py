"""The response that streams a model call to the agent (server-sent events) and stops it if the agent leaves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from services.proxy.call.pipeline import StreamSession

log = logging.getLogger(__name__)


class ProxyStream(Response):
    """Streams a StreamSession to the agent while watching for the agent to disconnect."""

    def __init__(self, session: StreamSession) -> None:
        self.session = session
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.raw_headers.append((b"content-type", b"text/event-stream; charset=utf-8"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        pump = asyncio.ensure_future(self._pump(send, send_body))
        listener = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((pump, listener), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                pump.cancel()
                await asyncio.wait((pump,))
        finally:
            listener.cancel()
        if not pump.cancelled() and pump.exception() is not None:
            log.error("stream of rollout %s failed", self.session._call.rollout_id, exc_info=pump.exception())
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, send_body: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        finally:
            await self.session.run(send_body)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
