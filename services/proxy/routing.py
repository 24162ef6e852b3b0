"""Routing table: the endpoints of the configured model, and a stable rollout -> endpoint choice.

Rendezvous (highest random weight) hashing: each endpoint scores hash(rollout_id, endpoint) and the rollout goes
to the best score. While the set is unchanged a rollout always lands on the same engine (prefix-cache reuse);
when an endpoint leaves, only its rollouts move, and each to its own next-best endpoint. Retries walk down the
same ranking, so failover is as stable as the first choice.

Only the endpoints at the model's highest version are routed to: an engine registered at an older version (one
restarted from the base model, or one whose last weight push failed) serves stale weights, and training samples
from it would be off-policy. It is held back until the trainer's next push brings it to the current version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    url: str  # base URL ending in /v1
    version: int = 0


def _score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class RoutingTable:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.revision = 0
        self._endpoints: tuple[Endpoint, ...] = ()
        self._current: tuple[Endpoint, ...] = ()

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    @property
    def stale(self) -> tuple[Endpoint, ...]:
        """The endpoints held back: registered at a version below the model's highest."""
        return tuple(e for e in self._endpoints if e not in self._current)

    def update(self, endpoints: Iterable[Endpoint], revision: int = 0) -> None:
        """Replaces the whole set (the models stream sends the full set each time)."""
        unique = {endpoint.url: endpoint for endpoint in endpoints}
        self._endpoints = tuple(sorted(unique.values(), key=lambda e: e.url))
        newest = max((e.version for e in self._endpoints), default=0)
        self._current = tuple(e for e in self._endpoints if e.version == newest)
        self.revision = revision

    def ranked(self, key: str) -> list[Endpoint]:
        """The endpoints at the current version, best first for this key."""
        endpoints = self._current
        if len(endpoints) <= 1:
            return list(endpoints)
        return sorted(endpoints, key=lambda e: _score(key, e.url), reverse=True)
