"""Settings of the stand-in engine: one frozen object built from flags, with AGL_STANDIN_* env-var defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StandinConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "standin-model"
    delay_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    fail_first: int = 0
    fail_status: int = 503
    mistake_rate: float = 0.0
    log_level: str = "warning"


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> StandinConfig:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="agl-standin-engine", description=__doc__)
    parser.add_argument("--host", default=env.get("AGL_STANDIN_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env.get("AGL_STANDIN_PORT", "8000")))
    parser.add_argument("--model", default=env.get("AGL_STANDIN_MODEL", "standin-model"), help="served model name")
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=float(env.get("AGL_STANDIN_DELAY_MS", "0")),
        help="wait before each answer (before the first chunk when streaming)",
    )
    parser.add_argument(
        "--chunk-delay-ms",
        type=float,
        default=float(env.get("AGL_STANDIN_CHUNK_DELAY_MS", "0")),
        help="wait between stream chunks",
    )
    parser.add_argument(
        "--fail-first",
        type=int,
        default=int(env.get("AGL_STANDIN_FAIL_FIRST", "0")),
        help="answer the first N generation requests with --fail-status",
    )
    parser.add_argument("--fail-status", type=int, default=int(env.get("AGL_STANDIN_FAIL_STATUS", "503")))
    parser.add_argument(
        "--mistake-rate",
        type=float,
        default=float(env.get("AGL_STANDIN_MISTAKE_RATE", "0")),
        help="when sampling (temperature > 0), answer this fraction of arithmetic questions off by one",
    )
    parser.add_argument("--log-level", default=env.get("AGL_LOG_LEVEL", "warning"))
    args = parser.parse_args(argv)
    if not 0.0 <= args.mistake_rate <= 1.0:
        parser.error(f"--mistake-rate must be between 0 and 1, not {args.mistake_rate}")
    return StandinConfig(**vars(args))
