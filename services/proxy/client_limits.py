"""Limits on the agents' side of the proxy: how many connections it serves and how long a request may take to come in.

Without them a client that opens a connection and sends half a request head holds a file handle for good; enough
of them (about a thousand under a container's usual open-file limit) leave nothing for real agents. The limits:

- header deadline: a request's head (request line and headers) must be complete this long after the connection
  opened or its first byte arrived; otherwise the proxy answers 408 and closes the connection.
- body deadline: its body must be complete this long after the head; otherwise 408 (or a close) too.
- connection cap: above it, a new connection first displaces the connection that has waited longest without a
  request in progress (idle keep-alive or an unfinished head); when none can go, the new one gets 503 with
  `Retry-After` and is closed at once, so the proxy never runs out of file handles.

The cap never exceeds half of what the open-file limit leaves (the other half is for engine connections); the
soft limit is raised toward the hard one first when the cap needs it.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from .config import ProxyConfig

log = logging.getLogger(__name__)

# File handles kept for everything but client and engine connections (the ledger channel, logs, the loop).
_RESERVED_FILES = 64


@dataclass(frozen=True)
class ClientLimits:
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 75.0
    # A connection waiting this long without a request may be displaced by a new one when the cap is reached (a
    # real client's head arrives well within it; a slow one's never does).
    displace_after_s: float = 0.05


def connection_budget(wanted: int) -> int:
    """The connection cap the open-file limit allows, after raising the soft limit toward `wanted` if it can."""
    need = 2 * wanted + _RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError) as err:
                log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, err)
    if soft == resource.RLIM_INFINITY:
        return wanted
    allowed = max(16, (soft - _RESERVED_FILES) // 2)
    if allowed < wanted:
        log.warning(
            "serving at most %d client connections (asked for %d): the open-file limit is %d", allowed, wanted, soft
        )
    return min(wanted, allowed)


def limits_for(config: ProxyConfig) -> ClientLimits:
    """The limits a proxy process serves with (the cap reduced to what the open-file limit allows)."""
    return ClientLimits(
        max_connections=connection_budget(config.max_client_connections),
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        keep_alive_s=config.keep_alive_s,
    )
