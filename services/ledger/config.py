"""Ledger settings: one frozen object built from command-line flags, with AGL_* environment defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services import settings as st

from .quotas import EVENT_BYTES, MIB, ROLLOUT_BYTES, ROLLOUT_EVENTS, SETTING_NAMES, EventQuotas


@dataclass(frozen=True)
class LedgerConfig:
    host: str = "127.0.0.1"  # loopback unless configured (the image sets 0.0.0.0)
    port: int = 50051
    store: str = "memory"  # "memory" or "sqlite:PATH"
    key: str | None = None  # bearer key; None disables auth
    metrics_port: int = 9464  # 0 disables the metrics endpoint
    max_message_mb: int = 64
    # Per-rollout limits (quotas.py): far above what an honest agent stores, low enough that one agent cannot fill
    # the ledger's memory or disk alone.
    max_rollout_events: int = 10_000
    max_rollout_mb: int = 256
    max_event_mb: int = 32
    watch_buffer: int = 8192  # changes a WatchRollouts consumer may fall behind before it is cut off
    ring_size: int = 50_000  # rollout changes kept for resuming watchers
    grace_seconds: float = 10.0  # how long SIGTERM waits for in-flight calls
    store_stall_seconds: float = 5.0  # health is NOT_SERVING while a write has waited this long for its commit
    log_level: str = "INFO"
    log_format: str = "text"  # "text" or "json" (one object per line)
    # Connection limits (see connection_limits.py).
    max_connections: int = 4096
    handshake_timeout_s: float = 10.0
    max_concurrent_streams: int = 1024
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    min_ping_interval_s: float = 10.0
    max_connection_idle_s: float = 300.0
    max_connection_age_s: float = 3600.0
    max_connection_age_grace_s: float = 0.0  # 0: calls in progress on an aged connection may run to their end

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def auth_mode(self) -> str:
        return "bearer key" if self.key else "none"

    @property
    def quotas(self) -> EventQuotas:
        return EventQuotas(self.max_rollout_events, self.max_rollout_mb * MIB, self.max_event_mb * MIB)

    @property
    def sqlite_path(self) -> str | None:
        return self.store.removeprefix("sqlite:") if self.store.startswith("sqlite:") else None


def _store(value: str) -> str:
    if value != "memory" and not (value.startswith("sqlite:") and len(value) > len("sqlite:")):
        raise ValueError
    return value


_D = LedgerConfig()
_S = st.seconds()
SETTINGS = st.Settings(
    "agl-ledger",
    "AGL ledger: rollouts, events and model endpoints.",
    [
        st.Setting("--host", "AGL_LEDGER_HOST", st.text(), _D.host,
                   "bind address, of the metrics too (loopback unless configured; 0.0.0.0 in the image)"),
        st.Setting("--port", "AGL_LEDGER_PORT", st.port(), _D.port, "gRPC port"),
        st.Setting("--store", "AGL_LEDGER_STORE", st.custom("'memory' or 'sqlite:PATH'", _store), _D.store,
                   "memory | sqlite:PATH"),
        st.Setting("--key", "AGL_KEY", st.text(empty_is_none=True), _D.key,
                   "bearer key every RPC but health must carry", secret=True, shown="none (no auth)"),
        st.Setting("--metrics-port", "AGL_LEDGER_METRICS_PORT", st.port(zero_is_off=True), _D.metrics_port,
                   "Prometheus metrics port"),
        # gRPC's message limits are 32-bit byte counts.
        st.Setting("--max-message-mb", "AGL_LEDGER_MAX_MESSAGE_MB", st.integer(1, 2047), _D.max_message_mb,
                   "largest gRPC message, in MiB, either way"),
        st.Setting(*SETTING_NAMES[ROLLOUT_EVENTS], st.integer(1), _D.max_rollout_events,
                   "events one rollout may hold, all its attempts together; more are refused (RESOURCE_EXHAUSTED)"),
        st.Setting(*SETTING_NAMES[ROLLOUT_BYTES], st.integer(1), _D.max_rollout_mb,
                   "MiB of events one rollout may hold, as stored; more are refused (RESOURCE_EXHAUSTED)"),
        st.Setting(*SETTING_NAMES[EVENT_BYTES], st.integer(1, 2047), _D.max_event_mb,
                   "MiB one event may take, as stored; a larger one is refused (RESOURCE_EXHAUSTED)"),
        st.Setting("--watch-buffer", "AGL_LEDGER_WATCH_BUFFER", st.integer(1), _D.watch_buffer,
                   "changes a watcher may lag before it is cut off (RESOURCE_EXHAUSTED; it resumes)"),
        st.Setting("--ring-size", "AGL_LEDGER_RING_SIZE", st.integer(1), _D.ring_size,
                   "changes kept for resuming watchers (more than --watch-buffer)"),
        st.Setting("--grace-seconds", "AGL_LEDGER_GRACE_SECONDS", st.seconds(zero=True), _D.grace_seconds,
                   "how long SIGTERM waits for in-flight calls"),
        st.Setting("--store-stall-seconds", "AGL_LEDGER_STORE_STALL_SECONDS", _S, _D.store_stall_seconds,
                   "gRPC health says NOT_SERVING while a write has waited this long for the store to commit it"),
        st.Setting("--log-level", "AGL_LOG_LEVEL", st.log_level(), _D.log_level),
        st.Setting("--log-format", "AGL_LOG_FORMAT", st.choice("text", "json"), _D.log_format,
                   "json: one object per line"),
        # Connection limits (see connection_limits.py).
        st.Setting("--max-connections", "AGL_LEDGER_MAX_CONNECTIONS", st.integer(1), _D.max_connections,
                   "connections served at once; more are refused at accept"),
        st.Setting("--handshake-timeout", "AGL_LEDGER_HANDSHAKE_TIMEOUT", _S, _D.handshake_timeout_s,
                   "seconds a new connection may take to finish the HTTP/2 handshake", name="handshake_timeout_s"),
        st.Setting("--max-concurrent-streams", "AGL_LEDGER_MAX_CONCURRENT_STREAMS", st.integer(1),
                   _D.max_concurrent_streams, "calls at once on one connection"),
        st.Setting("--keepalive", "AGL_LEDGER_KEEPALIVE", _S, _D.keepalive_s,
                   "seconds between the server's pings of an idle client", name="keepalive_s"),
        st.Setting("--keepalive-timeout", "AGL_LEDGER_KEEPALIVE_TIMEOUT", _S, _D.keepalive_timeout_s,
                   "seconds a client may take to answer a ping before it is dropped", name="keepalive_timeout_s"),
        st.Setting("--min-ping-interval", "AGL_LEDGER_MIN_PING_INTERVAL", _S, _D.min_ping_interval_s,
                   "shortest interval between a client's pings without calls", name="min_ping_interval_s"),
        st.Setting("--max-connection-idle", "AGL_LEDGER_MAX_CONNECTION_IDLE", _S, _D.max_connection_idle_s,
                   "seconds a connection without calls is kept", name="max_connection_idle_s"),
        st.Setting("--max-connection-age", "AGL_LEDGER_MAX_CONNECTION_AGE", _S, _D.max_connection_age_s,
                   "seconds after which a connection takes no new calls (GOAWAY)", name="max_connection_age_s"),
        st.Setting("--max-connection-age-grace", "AGL_LEDGER_MAX_CONNECTION_AGE_GRACE", st.seconds(zero=True),
                   _D.max_connection_age_grace_s, "seconds calls of an aged connection may go on; 0: to their end",
                   name="max_connection_age_grace_s"),
    ],
)  # fmt: skip


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> LedgerConfig:
    values = SETTINGS.parse(argv, env)
    if values["ring_size"] <= values["watch_buffer"]:
        SETTINGS.fail("--ring-size must exceed --watch-buffer so a cut-off watcher can resume")
    return LedgerConfig(**{**values, "log_level": values["log_level"].upper()})
