"""The proxy's limits on the agents' side (services/http_serving has the mechanism, shared with the console): how
many connections it serves and how long a request may take to come in.

The cap never exceeds half of what the open-file limit leaves (the other half is for engine connections); the
soft limit is raised toward the hard one first when the cap needs it.
"""

from __future__ import annotations

from services.http_serving import ClientLimits, connection_budget
from services.proxy.config import ProxyConfig


def limits_for(config: ProxyConfig) -> ClientLimits:
    """The limits a proxy process serves with (the cap reduced to what the open-file limit allows)."""
    return ClientLimits(
        max_connections=connection_budget(config.max_client_connections),
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        keep_alive_s=config.keep_alive_s,
    )
