"""Login by key: the master key or the read-only console key, exchanged for a session of its own.

Each login gets a new random session value (32 bytes, in the cookie only); the console keeps a hash of it with the
role the key granted and an expiry, so a session is worthless to another console process, after a restart, past
its lifetime, and after its logout (which forgets it). Keys are compared in constant time; a cookie that is not a
session this console made (any bytes at all) is simply no session. Wrong keys are throttled per client address.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

COOKIE = "agl_console"
MASTER = "master"
VIEWER = "viewer"

SESSION_TTL_S = 12 * 3600.0  # a session ends this long after its login, whatever it is used for
MAX_SESSIONS = 10_000  # the oldest session is forgotten (signed out) beyond this many


class Sessions:
    def __init__(
        self,
        master_key: str | None,
        console_key: str | None,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = {MASTER: master_key, VIEWER: console_key}
        self._ttl_s = ttl_s
        self._clock = clock
        self._live: OrderedDict[bytes, tuple[str, float]] = OrderedDict()  # hash of the value -> (role, expiry)

    @staticmethod
    def _digest(cookie: str) -> bytes:
        return hashlib.sha256(cookie.encode("utf-8", "surrogatepass")).digest()

    def login(self, key: str) -> str | None:
        """A new session's cookie value for a right key; None for a wrong one."""
        given = key.encode("utf-8", "surrogatepass")
        for role, expected in self._keys.items():
            if expected and hmac.compare_digest(given, expected.encode("utf-8", "surrogatepass")):
                cookie = secrets.token_urlsafe(32)
                self._live[self._digest(cookie)] = (role, self._clock() + self._ttl_s)
                while len(self._live) > MAX_SESSIONS:
                    self._live.popitem(last=False)
                return cookie
        return None

    def role(self, cookie: str | None) -> str | None:
        """The role of a live session; None for anything else (no cookie, a forged, expired or revoked one)."""
        if not cookie:
            return None
        digest = self._digest(cookie)
        found = self._live.get(digest)
        if found is None:
            return None
        role, expiry = found
        if self._clock() >= expiry:
            del self._live[digest]
            return None
        return role

    def logout(self, cookie: str | None) -> None:
        """Ends the session: its value opens nothing afterwards, wherever it was copied to."""
        if cookie:
            self._live.pop(self._digest(cookie), None)


class LoginThrottle:
    """Wrong keys per client address: the first `free` in a row are answered at once; each one after that shuts the
    address out for twice as long as the one before (1 s, 2 s, 4 s ... up to `longest_s`), during which every try,
    right key or not, is refused without being checked. A right key (outside a shut-out) clears the address; an
    address with no wrong key for `forget_s` starts afresh."""

    def __init__(
        self,
        free: int = 5,
        longest_s: float = 300.0,
        forget_s: float = 900.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._free = free
        self._longest_s = longest_s
        self._forget_s = forget_s
        self._max_addresses = max_addresses
        self._clock = clock
        self._seen: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # address -> (wrong, last, until)

    def wait_s(self, address: str) -> int:
        """Whole seconds `address` must wait before its next try (0: it may try now)."""
        found = self._seen.get(address)
        if found is None:
            return 0
        now = self._clock()
        if now - found[1] >= self._forget_s:
            del self._seen[address]
            return 0
        return max(0, math.ceil(found[2] - now))

    def failed(self, address: str) -> None:
        now = self._clock()
        wrong, last, _ = self._seen.pop(address, (0, now, now))
        if now - last >= self._forget_s:
            wrong = 0
        wrong += 1
        until = now
        if wrong > self._free:
            until = now + min(self._longest_s, 2.0 ** (wrong - self._free - 1))
        self._seen[address] = (wrong, now, until)
        while len(self._seen) > self._max_addresses:
            self._seen.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._seen.pop(address, None)
