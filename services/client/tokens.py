"""Per-rollout agent tokens: an agent may only act on its own rollout and attempt."""

from __future__ import annotations

import hashlib
import hmac


def agent_token(key: str, rollout_id: str, attempt_id: str) -> str:
    """HMAC-SHA256 of "{rollout_id}:{attempt_id}" under the master key, as lowercase hex."""
    message = f"{rollout_id}:{attempt_id}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def verify_agent_token(key: str, token: str, rollout_id: str, attempt_id: str) -> bool:
    """Constant-time check that token is the agent token of this rollout and attempt."""
    return hmac.compare_digest(agent_token(key, rollout_id, attempt_id), token)
