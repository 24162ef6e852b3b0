"""Routing table: the endpoints of the configured model, and a stable rollout -> endpoint choice.

Rendezvous (highest random weight) hashing: each endpoint scores hash(rollout_id, endpoint) and the rollout goes
to the best score. While the set is unchanged a rollout always lands on the same engine (prefix-cache reuse);
when an endpoint leaves, only its rollouts move, and each to its own next-best endpoint. Retries walk down the
same ranking, so failover is as stable as the first choice.

Only the endpoints at the model's highest version are routed to: an engine registered at an older version (one
restarted from the base model, or one whose last weight push failed) serves stale weights, and training samples
from it would be off-policy. It is held back until the trainer's next push brings it to the current version.

An endpoint can also be held back by name (`hold`), whatever its registered version: one whose engine labels its
weights otherwise than the registry says (restarted from its base model while the registry still lists it at the
last push's version), or one that does not answer (engines/weight_check.py decides which). A held endpoint is routed to
again once `release`d, and its hold is forgotten when it is unregistered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    url: str  # base URL ending in /v1
    version: int = 0
    weight_label: str = ""  # what the engine must report serving (empty: not checked; engines/weight_check.py)


def _score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class RoutingTable:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.revision = 0
        self._endpoints: tuple[Endpoint, ...] = ()
        self._current: tuple[Endpoint, ...] = ()
        self._held: dict[str, str] = {}  # url -> why it is held back
        self._routable: tuple[Endpoint, ...] = ()

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    @property
    def stale(self) -> tuple[Endpoint, ...]:
        """The endpoints held back: registered at a version below the model's highest."""
        return tuple(e for e in self._endpoints if e not in self._current)

    @property
    def held(self) -> dict[str, str]:
        """The endpoints held back by name, with why."""
        return dict(self._held)

    def hold(self, url: str, reason: str) -> bool:
        """Holds the endpoint at `url` back; whether that is news (not held, or held for another reason)."""
        if url not in {e.url for e in self._endpoints} or self._held.get(url) == reason:
            return False
        self._held[url] = reason
        self._refresh()
        return True

    def release(self, url: str) -> bool:
        """Routes to `url` again; whether it was held."""
        if self._held.pop(url, None) is None:
            return False
        self._refresh()
        return True

    def _refresh(self) -> None:
        self._routable = tuple(e for e in self._current if e.url not in self._held)

    def update(self, endpoints: Iterable[Endpoint], revision: int = 0) -> None:
        """Replaces the whole set (the models stream sends the full set each time)."""
        unique = {endpoint.url: endpoint for endpoint in endpoints}
        self._endpoints = tuple(sorted(unique.values(), key=lambda e: e.url))
        newest = max((e.version for e in self._endpoints), default=0)
        self._current = tuple(e for e in self._endpoints if e.version == newest)
        self._held = {url: why for url, why in self._held.items() if url in unique}
        self._refresh()
        self.revision = revision

    def ranked(self, key: str) -> list[Endpoint]:
        """The endpoints at the current version and not held back, best first for this key."""
        endpoints = self._routable
        if len(endpoints) <= 1:
            return list(endpoints)
        return sorted(endpoints, key=lambda e: _score(key, e.url), reverse=True)
