"""Proxy settings: one frozen object built from flags, with AGL_* environment variables as defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProxyConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    ledger: str = "127.0.0.1:50051"
    model_name: str = ""
    key: str | None = field(default=None, repr=False)
    engine_api_key: str | None = field(default=None, repr=False)
    train_temperature: float | None = 1.0
    val_temperature: float | None = 0.0
    logprobs: bool = True
    retry_attempts: int = 4
    retry_initial_backoff_s: float = 0.1
    retry_max_backoff_s: float = 2.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    ledger_timeout_s: float = 10.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_connections: int = 1024  # engine connections (the pool's size)
    max_client_connections: int = 4096  # agents' connections (reduced to what the open-file limit allows)
    header_timeout_s: float = 10.0  # a request head must arrive within this (408 otherwise)
    body_timeout_s: float = 60.0  # and its body within this after the head
    keep_alive_s: float = 75.0  # an idle agent connection is closed after this
    rollout_cache_ttl_s: float = 60.0  # a stale entry costs one engine call at most (see gateway)
    heartbeat_s: float = 2.0
    replica_ttl_s: float = 10.0
    replica_id: str = ""
    workers: int = 1
    log_level: str = "info"
    # Train calls continuing a rollout's turn are sent as the sampled tokens + the new context (token_continuation).
    token_continuation: bool = True
    token_continuation_rollouts: int = 4096  # rollout attempts whose last turns are kept (4 bytes a token)


def _optional_float(value: str) -> float | None:
    return None if value.strip().lower() in ("", "none", "keep") else float(value)


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ProxyConfig:
    env = os.environ if env is None else env
    d = ProxyConfig()
    p = argparse.ArgumentParser(prog="agl-proxy", description="OpenAI-compatible, token-capturing proxy.")
    p.add_argument("--host", default=env.get("AGL_PROXY_HOST", d.host))
    p.add_argument("--port", type=int, default=int(env.get("AGL_PROXY_PORT", d.port)))
    p.add_argument("--ledger", default=env.get("AGL_LEDGER_ADDR", d.ledger), help="ledger gRPC address")
    p.add_argument("--model-name", default=env.get("AGL_MODEL_NAME", d.model_name), help="model to serve")
    p.add_argument("--key", default=env.get("AGL_KEY") or None, help="master key (agents get per-rollout tokens)")
    p.add_argument("--engine-api-key", default=env.get("AGL_ENGINE_API_KEY") or None, help="key sent to engines")
    p.add_argument(
        "--train-temperature",
        type=_optional_float,
        default=_optional_float(env.get("AGL_PROXY_TRAIN_TEMPERATURE", str(d.train_temperature))),
        help="temperature forced in train mode ('keep' leaves the agent's)",
    )
    p.add_argument(
        "--val-temperature",
        type=_optional_float,
        default=_optional_float(env.get("AGL_PROXY_VAL_TEMPERATURE", str(d.val_temperature))),
        help="temperature forced in val mode ('keep' leaves the agent's)",
    )
    p.add_argument(
        "--logprobs",
        action=argparse.BooleanOptionalAction,
        default=_bool(env.get("AGL_PROXY_LOGPROBS", "true")),
        help="request log-probs in train mode",
    )
    p.add_argument("--retry-attempts", type=int, default=int(env.get("AGL_PROXY_RETRY_ATTEMPTS", d.retry_attempts)))
    p.add_argument(
        "--retry-initial-backoff",
        dest="retry_initial_backoff_s",
        type=float,
        default=float(env.get("AGL_PROXY_RETRY_INITIAL_BACKOFF", d.retry_initial_backoff_s)),
    )
    p.add_argument(
        "--retry-max-backoff",
        dest="retry_max_backoff_s",
        type=float,
        default=float(env.get("AGL_PROXY_RETRY_MAX_BACKOFF", d.retry_max_backoff_s)),
    )
    p.add_argument(
        "--connect-timeout",
        dest="connect_timeout_s",
        type=float,
        default=float(env.get("AGL_PROXY_CONNECT_TIMEOUT", d.connect_timeout_s)),
    )
    p.add_argument(
        "--read-timeout",
        dest="read_timeout_s",
        type=float,
        default=float(env.get("AGL_PROXY_READ_TIMEOUT", d.read_timeout_s)),
        help="longest wait for the engine's answer (between chunks when streaming)",
    )
    p.add_argument(
        "--ledger-timeout",
        dest="ledger_timeout_s",
        type=float,
        default=float(env.get("AGL_PROXY_LEDGER_TIMEOUT", d.ledger_timeout_s)),
    )
    p.add_argument("--max-body-bytes", type=int, default=int(env.get("AGL_PROXY_MAX_BODY_BYTES", d.max_body_bytes)))
    p.add_argument("--max-connections", type=int, default=int(env.get("AGL_PROXY_MAX_CONNECTIONS", d.max_connections)))
    p.add_argument(
        "--max-client-connections",
        type=int,
        default=int(env.get("AGL_PROXY_MAX_CLIENT_CONNECTIONS", d.max_client_connections)),
        help="agents' connections served at once; above it the longest-waiting idle one is closed, or 503",
    )
    p.add_argument(
        "--header-timeout",
        dest="header_timeout_s",
        type=float,
        default=float(env.get("AGL_PROXY_HEADER_TIMEOUT", d.header_timeout_s)),
        help="seconds a request's head may take to arrive (408 and close otherwise)",
    )
    p.add_argument(
        "--body-timeout",
        dest="body_timeout_s",
        type=float,
        default=float(env.get("AGL_PROXY_BODY_TIMEOUT", d.body_timeout_s)),
        help="seconds a request's body may take to arrive after its head (408 and close otherwise)",
    )
    p.add_argument(
        "--keep-alive",
        dest="keep_alive_s",
        type=float,
        default=float(env.get("AGL_PROXY_KEEP_ALIVE", d.keep_alive_s)),
        help="seconds an idle agent connection is kept open",
    )
    p.add_argument(
        "--rollout-cache-ttl",
        dest="rollout_cache_ttl_s",
        type=float,
        default=float(env.get("AGL_PROXY_ROLLOUT_CACHE_TTL", d.rollout_cache_ttl_s)),
    )
    p.add_argument(
        "--heartbeat", dest="heartbeat_s", type=float, default=float(env.get("AGL_PROXY_HEARTBEAT", d.heartbeat_s))
    )
    p.add_argument(
        "--replica-ttl",
        dest="replica_ttl_s",
        type=float,
        default=float(env.get("AGL_PROXY_REPLICA_TTL", d.replica_ttl_s)),
    )
    p.add_argument("--replica-id", default=env.get("AGL_PROXY_REPLICA_ID", ""), help="default: host-pid-random")
    p.add_argument("--workers", type=int, default=int(env.get("AGL_PROXY_WORKERS", d.workers)))
    p.add_argument("--log-level", default=env.get("AGL_LOG_LEVEL", d.log_level))
    p.add_argument(
        "--token-continuation",
        action=argparse.BooleanOptionalAction,
        default=_bool(env.get("AGL_PROXY_TOKEN_CONTINUATION", "true")),
        help="continue a rollout's earlier turn in the tokens the model sampled, where its history re-renders to "
        "the same text (needs engines with vLLM's render/generate endpoints: agl-engine starts them)",
    )
    p.add_argument(
        "--token-continuation-rollouts",
        type=int,
        default=int(env.get("AGL_PROXY_TOKEN_CONTINUATION_ROLLOUTS", d.token_continuation_rollouts)),
        help="rollout attempts whose last turns' tokens are kept for token continuation",
    )
    args = p.parse_args(argv)
    if not args.model_name:
        p.error("--model-name (or AGL_MODEL_NAME) is required")
    if args.retry_attempts < 1:
        p.error("--retry-attempts must be at least 1")
    if args.max_client_connections < 1:
        p.error("--max-client-connections must be at least 1")
    if args.token_continuation_rollouts < 1:
        p.error("--token-continuation-rollouts must be at least 1 (turn it off with --no-token-continuation)")
    if min(args.header_timeout_s, args.body_timeout_s, args.keep_alive_s) <= 0:
        p.error("--header-timeout, --body-timeout and --keep-alive must be positive")
    return ProxyConfig(**vars(args))
