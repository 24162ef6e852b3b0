"""The gRPC server's limits on connections, so that slow, idle or abusive clients cannot exhaust the ledger.

- at most `max_connections` connections (gRPC refuses more at accept time, capped by the open-file limit);
- a new connection must finish the HTTP/2 handshake within `handshake_timeout_s` or is closed;
- at most `max_concurrent_streams` calls at once on one connection (more wait for a free stream);
- keepalive: the server pings an idle client every `keepalive_s` and drops it if no answer comes within
  `keepalive_timeout_s`; a client may ping without calls, but not more often than `min_ping_interval_s`
  (two pings too many and the connection is closed with GOAWAY `too_many_pings`);
- a connection with no call for `max_connection_idle_s` is closed (the client reconnects on its next call);
- a connection older than `max_connection_age_s` is told to go away (GOAWAY): no new calls on it, while calls in
  progress, watches included, continue for `max_connection_age_grace_s` (0: until they end); the client
  reconnects for new calls, so long-lived clients are rebalanced and cannot pin a connection for good.
"""

from __future__ import annotations

import resource
from typing import Any

_RESERVED_FILES = 64  # for the store, the metrics endpoint, logs


def open_file_budget(wanted: int) -> int:
    """`wanted` reduced to what the open-file soft limit leaves for connections."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - _RESERVED_FILES))


def server_options(config: Any) -> list[tuple[str, int]]:
    """grpc.aio.server options for a LedgerConfig's limits."""
    ms = 1000
    options = [
        ("grpc.max_allowed_incoming_connections", open_file_budget(config.max_connections)),
        ("grpc.server_handshake_timeout_ms", int(config.handshake_timeout_s * ms)),
        ("grpc.max_concurrent_streams", config.max_concurrent_streams),
        ("grpc.keepalive_time_ms", int(config.keepalive_s * ms)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_ping_interval_s * ms)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", int(config.max_connection_idle_s * ms)),
        ("grpc.max_connection_age_ms", int(config.max_connection_age_s * ms)),
    ]
    if config.max_connection_age_grace_s > 0:
        options.append(("grpc.max_connection_age_grace_ms", int(config.max_connection_age_grace_s * ms)))
    return options
