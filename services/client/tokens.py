"""Per-rollout agent tokens: an agent may only act on its own rollout and attempt.

A token is an HMAC-SHA256 under the master key of the (rollout id, attempt id) pair in an unambiguous encoding:
each id is preceded by its length in UTF-8 bytes, so no two different pairs give the same message (with the
older `"{rollout_id}:{attempt_id}"` message, rollout `c1:x` attempt `A` and rollout `c1` attempt `x:A` shared a
token). A leading version tag keeps tokens of this scheme apart from any other use of the key.
"""

from __future__ import annotations

import hashlib
import hmac

_TAG = b"agl-agent-token-v2\n"


def _message(rollout_id: str, attempt_id: str) -> bytes:
    rollout = rollout_id.encode("utf-8", "surrogatepass")
    attempt = attempt_id.encode("utf-8", "surrogatepass")
    return b"%s%d:%s%d:%s" % (_TAG, len(rollout), rollout, len(attempt), attempt)


def agent_token(key: str, rollout_id: str, attempt_id: str) -> str:
    """HMAC-SHA256 of the length-prefixed (rollout id, attempt id) pair under the master key, as lowercase hex."""
    return hmac.new(key.encode(), _message(rollout_id, attempt_id), hashlib.sha256).hexdigest()


def verify_agent_token(key: str, token: str, rollout_id: str, attempt_id: str) -> bool:
    """Constant-time check that token is the agent token of this rollout and attempt. Any string may be given
    (a header value with non-ASCII characters is simply not a valid token)."""
    given = token.encode("utf-8", "surrogatepass")
    return hmac.compare_digest(agent_token(key, rollout_id, attempt_id).encode(), given)
