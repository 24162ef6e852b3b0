"""Bearer-key authentication for every RPC except health checking."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
DENIED = "missing or wrong bearer key: send metadata 'authorization: Bearer <key>'"


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that fails with UNAUTHENTICATED."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny, **kwargs)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, key: str) -> None:
        self._expected = f"bearer {key}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(EXEMPT_PREFIXES) or self._authorized(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        return None if handler is None else _denying(handler)

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                # Case-insensitive scheme, constant-time comparison of the whole value.
                if given[:7].lower() == b"bearer ":
                    given = b"bearer " + given[7:].strip()
                return hmac.compare_digest(given, self._expected)
        return False
