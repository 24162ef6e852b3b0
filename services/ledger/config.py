"""Ledger settings: one frozen object built from command-line flags, with AGL_* environment defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerConfig:
    host: str = "0.0.0.0"
    port: int = 50051
    store: str = "memory"  # "memory" or "sqlite:PATH"
    key: str | None = None  # bearer key; None disables auth
    metrics_port: int = 9464  # 0 disables the metrics endpoint
    max_message_mb: int = 64
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
    def sqlite_path(self) -> str | None:
        return self.store.removeprefix("sqlite:") if self.store.startswith("sqlite:") else None


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> LedgerConfig:
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="agl-ledger", description="AGL ledger: rollouts, events and model endpoints.")
    p.add_argument("--host", default=env.get("AGL_LEDGER_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(env.get("AGL_LEDGER_PORT", "50051")))
    p.add_argument("--store", default=env.get("AGL_LEDGER_STORE", "memory"), help="memory | sqlite:PATH")
    p.add_argument("--key", default=env.get("AGL_KEY") or None, help="bearer key every RPC but health must carry")
    p.add_argument("--metrics-port", type=int, default=int(env.get("AGL_LEDGER_METRICS_PORT", "9464")))
    p.add_argument("--max-message-mb", type=int, default=int(env.get("AGL_LEDGER_MAX_MESSAGE_MB", "64")))
    p.add_argument("--watch-buffer", type=int, default=int(env.get("AGL_LEDGER_WATCH_BUFFER", "8192")))
    p.add_argument("--ring-size", type=int, default=int(env.get("AGL_LEDGER_RING_SIZE", "50000")))
    p.add_argument("--grace-seconds", type=float, default=float(env.get("AGL_LEDGER_GRACE_SECONDS", "10")))
    p.add_argument(
        "--store-stall-seconds",
        type=float,
        default=float(env.get("AGL_LEDGER_STORE_STALL_SECONDS", "5")),
        help="gRPC health says NOT_SERVING while a write has waited this long for the store to commit it",
    )
    p.add_argument("--log-level", default=env.get("AGL_LOG_LEVEL", "INFO"))
    p.add_argument("--log-format", choices=("text", "json"), default=env.get("AGL_LOG_FORMAT", "text"))
    d = LedgerConfig()
    limits = (
        ("max_connections", int, "connections served at once; more are refused at accept"),
        ("handshake_timeout_s", float, "seconds a new connection may take to finish the HTTP/2 handshake"),
        ("max_concurrent_streams", int, "calls at once on one connection"),
        ("keepalive_s", float, "seconds between the server's pings of an idle client"),
        ("keepalive_timeout_s", float, "seconds a client may take to answer a ping before it is dropped"),
        ("min_ping_interval_s", float, "shortest interval between a client's pings without calls"),
        ("max_connection_idle_s", float, "seconds a connection without calls is kept"),
        ("max_connection_age_s", float, "seconds after which a connection takes no new calls (GOAWAY)"),
        ("max_connection_age_grace_s", float, "seconds calls of an aged connection may go on; 0: to their end"),
    )
    for name, kind, text in limits:
        flag = name.removesuffix("_s").replace("_", "-")
        env_name = "AGL_LEDGER_" + name.removesuffix("_s").upper()
        default = kind(env.get(env_name, getattr(d, name)))
        p.add_argument(f"--{flag}", dest=name, type=kind, default=default, help=f"{text} (env {env_name})")
    args = p.parse_args(argv)
    if args.max_connections < 1 or args.max_concurrent_streams < 1:
        p.error("--max-connections and --max-concurrent-streams must be positive")
    if min(args.handshake_timeout_s, args.keepalive_s, args.keepalive_timeout_s, args.min_ping_interval_s) <= 0:
        p.error("--handshake-timeout, --keepalive, --keepalive-timeout and --min-ping-interval must be positive")
    if min(args.max_connection_idle_s, args.max_connection_age_s) <= 0 or args.max_connection_age_grace_s < 0:
        p.error("--max-connection-idle and --max-connection-age must be positive, the grace not negative")
    if args.store != "memory" and not (args.store.startswith("sqlite:") and len(args.store) > len("sqlite:")):
        p.error(f"--store must be 'memory' or 'sqlite:PATH', not {args.store!r}")
    if args.max_message_mb <= 0 or args.watch_buffer <= 0 or args.ring_size <= 0:
        p.error("--max-message-mb, --watch-buffer and --ring-size must be positive")
    if args.store_stall_seconds <= 0:
        p.error("--store-stall-seconds must be positive")
    if args.ring_size <= args.watch_buffer:
        p.error("--ring-size must exceed --watch-buffer so a cut-off watcher can resume")
    return LedgerConfig(
        host=args.host,
        port=args.port,
        store=args.store,
        key=args.key,
        metrics_port=args.metrics_port,
        max_message_mb=args.max_message_mb,
        watch_buffer=args.watch_buffer,
        ring_size=args.ring_size,
        grace_seconds=args.grace_seconds,
        store_stall_seconds=args.store_stall_seconds,
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        **{name: getattr(args, name) for name, _, _ in limits},
    )
