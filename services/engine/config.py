"""Engine settings: one frozen object built from flags, with AGL_ENGINE_* environment variables as defaults.

Pure: it neither imports vLLM nor touches the file system, so it runs in either venv.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineConfig:
    model_dir: str = ""
    # The trainer's default agl.model_name; the proxy rewrites every request's "model" to it.
    served_model_name: str = "agl-policy"
    host: str = "127.0.0.1"
    port: int = 8011
    max_model_len: int = 512
    kv_cache_gib: int = 1
    dtype: str = "float32"
    enforce_eager: bool = True
    # The interpreter that has vLLM's CPU build; "" = this one if it has vLLM, else the checkout's .venv-engine.
    python: str = ""
    api_key: str | None = field(default=None, repr=False)
    log_level: str = "info"
    # vLLM's --tool-call-parser (with --enable-auto-tool-choice): "hermes" reads the tiny model's
    # <tool_call>{...}</tool_call> calls; "" serves no tools (a request with `tools` is then refused by vLLM).
    tool_call_parser: str = "hermes"
    # vLLM's render / generate / derender endpoints (--enable-scale-out): the proxy continues a rollout's turns
    # in the tokens the model sampled through them (services/proxy/token_continuation.py).
    token_endpoints: bool = True
    extra_args: tuple[str, ...] = ()


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> EngineConfig:
    env = os.environ if env is None else env
    d = EngineConfig()
    p = argparse.ArgumentParser(
        prog="agl-engine",
        description="vLLM's CPU build serving one model, with AGL's worker extension (weights reloadable in place). "
        "Arguments after `--` go to vLLM's api_server unchanged.",
    )
    p.add_argument(
        "--model-dir", default=env.get("AGL_ENGINE_MODEL_DIR", d.model_dir), help="Hugging Face model directory"
    )
    p.add_argument(
        "--served-model-name",
        default=env.get("AGL_ENGINE_SERVED_MODEL_NAME", d.served_model_name),
        help="the model name clients (the proxy) send",
    )
    p.add_argument("--host", default=env.get("AGL_ENGINE_HOST", d.host))
    p.add_argument("--port", type=int, default=int(env.get("AGL_ENGINE_PORT", d.port)))
    p.add_argument("--max-model-len", type=int, default=int(env.get("AGL_ENGINE_MAX_MODEL_LEN", d.max_model_len)))
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=int(env.get("AGL_ENGINE_KV_CACHE_GIB", d.kv_cache_gib)),
        help="KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)",
    )
    p.add_argument("--dtype", default=env.get("AGL_ENGINE_DTYPE", d.dtype))
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=_bool(env.get("AGL_ENGINE_ENFORCE_EAGER", str(d.enforce_eager))),
        help="skip graph compilation (starts in ~35 s instead of ~105 s on 2 cores)",
    )
    p.add_argument(
        "--python",
        default=env.get("AGL_ENGINE_PYTHON", d.python),
        help="interpreter with vLLM's CPU build (default: this one if it has vLLM, else .venv-engine/bin/python)",
    )
    p.add_argument("--api-key", default=env.get("AGL_ENGINE_API_KEY") or None, help="key vLLM requires on /v1")
    p.add_argument("--log-level", default=env.get("AGL_ENGINE_LOG_LEVEL", d.log_level))
    p.add_argument(
        "--tool-call-parser",
        default=env.get("AGL_ENGINE_TOOL_CALL_PARSER", d.tool_call_parser),
        help="vLLM tool-call parser for requests with `tools` (hermes: the tiny model's format; none: no tools)",
    )
    p.add_argument(
        "--token-endpoints",
        action=argparse.BooleanOptionalAction,
        default=_bool(env.get("AGL_ENGINE_TOKEN_ENDPOINTS", str(d.token_endpoints))),
        help="serve vLLM's render/generate/derender endpoints (--enable-scale-out), which the proxy's token "
        "continuation uses",
    )
    p.add_argument("vllm_args", nargs="*", help="passed to vLLM (after `--`)")
    args = p.parse_args(argv)
    extra = tuple(shlex.split(env.get("AGL_ENGINE_EXTRA_ARGS", ""))) + tuple(args.vllm_args)
    if not args.model_dir:
        p.error("--model-dir (or AGL_ENGINE_MODEL_DIR) is required: the Hugging Face model directory to serve")
    for name in ("port", "max_model_len", "kv_cache_gib"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return EngineConfig(
        model_dir=args.model_dir,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        python=args.python,
        api_key=args.api_key,
        log_level=args.log_level,
        tool_call_parser="" if args.tool_call_parser.strip().lower() in ("", "none") else args.tool_call_parser.strip(),
        token_endpoints=args.token_endpoints,
        extra_args=extra,
    )
