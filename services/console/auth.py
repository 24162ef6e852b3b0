"""Login by key: the master key or the read-only console key, exchanged for a signed session cookie.

The cookie holds no key: it is an HMAC, under a secret made at start-up, of the role the key granted, so it is
worthless to another console process and after a restart. Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

COOKIE = "agl_console"
MASTER = "master"
VIEWER = "viewer"


class Sessions:
    def __init__(self, master_key: str | None, console_key: str | None) -> None:
        self._keys = {MASTER: master_key, VIEWER: console_key}
        self._secret = secrets.token_bytes(32)

    def _sign(self, role: str) -> str:
        return hmac.new(self._secret, role.encode(), hashlib.sha256).hexdigest()

    def login(self, key: str) -> str | None:
        """The cookie value for a right key; None for a wrong one."""
        given = key.encode("utf-8", "surrogatepass")
        for role, expected in self._keys.items():
            if expected and hmac.compare_digest(given, expected.encode("utf-8", "surrogatepass")):
                return f"{role}.{self._sign(role)}"
        return None

    def role(self, cookie: str | None) -> str | None:
        if not cookie or "." not in cookie:
            return None
        role, _, signature = cookie.partition(".")
        if role not in self._keys or not self._keys[role]:
            return None
        return role if hmac.compare_digest(signature, self._sign(role)) else None
