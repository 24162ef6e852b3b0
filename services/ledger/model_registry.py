"""Registry of model endpoints, keyed by (model_name, endpoint), with a revision per change."""

from __future__ import annotations

import urllib.parse

from services._gen.agl.v1 import model_pb2

from .changes import Changes
from .errors import InvalidArgument

Key = tuple[str, str]

_MAX_ENDPOINT = 2048


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be a model server's base URL (None when it can): the proxy joins an API path to it and
    logs it, so it must be an absolute http(s) URL of printable ASCII, with a host, a valid port, no query or
    fragment. Checked when it is registered, so nothing unroutable (or that forges a log line) is ever stored."""
    if len(endpoint) > _MAX_ENDPOINT:
        return f"is longer than {_MAX_ENDPOINT} characters"
    if any(not 0x21 <= ord(c) <= 0x7E for c in endpoint):
        return "has a space, a control character or a non-ASCII character"
    try:
        parts = urllib.parse.urlsplit(endpoint)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as err:
        return f"is not a URL ({err})"
    if parts.scheme not in ("http", "https"):
        return "is not an http:// or https:// URL"
    if not parts.hostname:
        return "has no host"
    if not port_ok:
        return "has port 0"
    if parts.query or parts.fragment or endpoint.endswith(("?", "#")):
        return "has a query or a fragment"
    return None


class ModelRegistry:
    def __init__(self, revision: int = 0) -> None:
        self.revision = revision
        self._endpoints: dict[Key, model_pb2.ModelEndpoint] = {}
        self.changes = Changes()

    def restore(self, endpoint: model_pb2.ModelEndpoint) -> None:
        self._endpoints[(endpoint.model_name, endpoint.endpoint)] = endpoint

    def upsert(self, endpoints: list[model_pb2.ModelEndpoint], now_ns: int) -> list[model_pb2.ModelEndpoint]:
        for i, ep in enumerate(endpoints):
            if not ep.model_name or not ep.endpoint:
                raise InvalidArgument(f"endpoints[{i}]: model_name and endpoint are required")
            problem = endpoint_problem(ep.endpoint)
            if problem:
                shown = repr(ep.endpoint[:200]) + ("..." if len(ep.endpoint) > 200 else "")
                raise InvalidArgument(
                    f"endpoints[{i}].endpoint {shown} {problem}: want a model server's base URL such as "
                    "http://10.0.0.5:8000/v1"
                )
        stored = []
        for ep in endpoints:
            copy = model_pb2.ModelEndpoint()
            copy.CopyFrom(ep)
            copy.update_time.FromNanoseconds(now_ns)
            self._endpoints[(copy.model_name, copy.endpoint)] = copy
            stored.append(copy)
        self.revision += 1
        self.changes.bump()
        return stored

    def matching(self, keys: list[model_pb2.ModelEndpointKey]) -> list[Key]:
        found: list[Key] = []
        for i, key in enumerate(keys):
            if not key.model_name:
                raise InvalidArgument(f"keys[{i}]: model_name is required")
            found.extend(
                k for k in self._endpoints if k[0] == key.model_name and (not key.endpoint or k[1] == key.endpoint)
            )
        return list(dict.fromkeys(found))

    def delete(self, keys: list[Key]) -> int:
        removed = sum(1 for k in keys if self._endpoints.pop(k, None) is not None)
        if removed:
            self.revision += 1
            self.changes.bump()
        return removed

    def list(self, model_name: str = "") -> list[model_pb2.ModelEndpoint]:
        return sorted(
            (ep for k, ep in self._endpoints.items() if not model_name or k[0] == model_name),
            key=lambda ep: (ep.model_name, ep.endpoint),
        )
