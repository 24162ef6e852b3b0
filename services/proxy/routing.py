"""Routing table: the endpoints of the configured model, and a stable rollout -> endpoint choice.

Rendezvous (highest random weight) hashing: each endpoint scores hash(rollout_id, endpoint) and the rollout goes
to the best score. While the set is unchanged a rollout always lands on the same engine (prefix-cache reuse);
when an endpoint leaves, only its rollouts move, and each to its own next-best endpoint. Retries walk down the
same ranking, so failover is as stable as the first choice.
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

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    def update(self, endpoints: Iterable[Endpoint], revision: int = 0) -> None:
        """Replaces the whole set (the models stream sends the full set each time)."""
        unique = {endpoint.url: endpoint for endpoint in endpoints}
        self._endpoints = tuple(sorted(unique.values(), key=lambda e: e.url))
        self.revision = revision

    def ranked(self, key: str) -> list[Endpoint]:
        """All endpoints, best first for this key."""
        endpoints = self._endpoints
        if len(endpoints) <= 1:
            return list(endpoints)
        return sorted(endpoints, key=lambda e: _score(key, e.url), reverse=True)
