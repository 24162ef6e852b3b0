"""Error shapes: each agent API answers errors in its own shape, chosen by the routes it is served on.

A domain error (errors.ProxyError) has one status, from the one table in errors.py, and an OpenAI-shaped body; a
route of another API carries that API's shaper, which rewrites the body (Anthropic's {"type": "error", ...}). The
app's exception handlers ask the route that took the request for its shaper, so an error raised anywhere under an
Anthropic route (its auth, its body, a 405, a bug) reaches the agent's SDK in the shape it parses. A request no
route took (a 404) is answered OpenAI-shaped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

# (the OpenAI-shaped error body, its HTTP status) -> the body in the route's API's shape.
ErrorShape = Callable[[dict[str, Any], int], dict[str, Any]]

# Where a ShapedRoute leaves its shaper in the request's scope for the exception handlers.
_SCOPE_KEY = "agl.error_shape"


def openai_shape(body: dict[str, Any], status: int) -> dict[str, Any]:
    """OpenAI's shape: the proxy's own error bodies are already in it."""
    return body


class ShapedRoute(Route):
    """A route whose errors are answered in `error_shape`."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, error_shape: ErrorShape, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.error_shape = error_shape

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Set here rather than read from Starlette's scope["route"], which Starlette before 1.0 does not set; handle
        # runs for the route that took the request, a 405 included.
        scope[_SCOPE_KEY] = self.error_shape
        await super().handle(scope, receive, send)


def error_shape_of(scope: Scope) -> ErrorShape:
    """The shaper of the route that took the request; OpenAI's where no ShapedRoute did."""
    shape: ErrorShape = scope.get(_SCOPE_KEY, openai_shape)
    return shape
