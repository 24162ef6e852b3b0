"""Who may call: the master key everywhere, a per-rollout agent token only on its own rollout and attempt."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from services.client import verify_agent_token
from services.proxy.errors import ProxyError


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from `Authorization: Bearer ...` or `x-api-key`."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return headers.get("x-api-key") or None


class Authorizer:
    """Checks keys; with no key configured everything is allowed."""

    def __init__(self, key: str | None) -> None:
        self._key = key or None
        self._key_bytes = self._key.encode() if self._key else b""

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def is_master(self, presented: str | None) -> bool:
        if self._key is None:
            return True
        # Bytes, not str: compare_digest refuses str with non-ASCII characters (a TypeError, that is a 500).
        return presented is not None and hmac.compare_digest(
            presented.encode("utf-8", "surrogatepass"), self._key_bytes
        )

    def require_master(self, presented: str | None) -> None:
        if not self.is_master(presented):
            raise ProxyError("unauthorized", "This route needs the master key.")

    def require_rollout(self, presented: str | None, rollout_id: str, attempt_id: str) -> None:
        """The master key, or the agent token of exactly this rollout and attempt."""
        if self._key is None or self.is_master(presented):
            return
        if presented is None:
            raise ProxyError("unauthorized", "Missing key: send `Authorization: Bearer <key>`.")
        if not verify_agent_token(self._key, presented, rollout_id, attempt_id):
            raise ProxyError("unauthorized", "Invalid key for this rollout and attempt.")
