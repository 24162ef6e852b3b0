"""Engine settings: one frozen object built from flags, with AGL_ENGINE_* environment variables as defaults.

Pure: it neither imports vLLM nor touches the file system, so it runs in either venv.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services import settings as st


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
    # vLLM on CPU runs the model in a worker process of its own: one more interpreter importing vLLM (~25 s of a
    # ~70 s start on 2 cores). Off, the model runs in the engine core's process (same tokens/s, measured).
    worker_process: bool = False
    # The interpreter that has vLLM's CPU build; "" = this one if it has vLLM, else a checkout's .venv-engine.
    python: str = ""
    api_key: str | None = field(default=None, repr=False)
    log_level: str = "info"
    # vLLM's --tool-call-parser (with --enable-auto-tool-choice): "hermes" reads the tiny model's
    # <tool_call>{...}</tool_call> calls; "" serves no tools (a request with `tools` is then refused by vLLM).
    tool_call_parser: str = "hermes"
    # vLLM's render / generate / derender endpoints (--enable-scale-out): the proxy continues a rollout's turns
    # in the tokens the model sampled through them (services/proxy/call/continuation.py).
    token_endpoints: bool = True
    # LoRA adapters loaded at runtime (a LoRA run's pushes: services/trainer/run/lora.py): the largest rank one may
    # have (vLLM's --max-lora-rank; 0: no LoRA) and how many are served at once (--max-loras: one per run).
    lora_rank: int = 0
    max_loras: int = 1
    extra_args: tuple[str, ...] = ()


def _tool_call_parser(value: str) -> str:
    return "" if value.strip().lower() in ("", "none") else value.strip()


_D = EngineConfig()
_N = st.integer(1)
SETTINGS = st.Settings(
    "agl-engine",
    "vLLM's CPU build serving one model, with AGL's worker extension (weights reloadable in place). "
    "Arguments after `--` go to vLLM's api_server unchanged.",
    [
        st.Setting("--model-dir", "AGL_ENGINE_MODEL_DIR", st.text(), _D.model_dir, "Hugging Face model directory",
                   shown="required"),
        st.Setting("--served-model-name", "AGL_ENGINE_SERVED_MODEL_NAME", st.text(nonempty=True),
                   _D.served_model_name, "the model name clients (the proxy) send: the trainer's "
                   "agl.model_name; the proxy rewrites every request's model to it"),
        st.Setting("--host", "AGL_ENGINE_HOST", st.text(), _D.host),
        st.Setting("--port", "AGL_ENGINE_PORT", st.port(), _D.port),
        st.Setting("--max-model-len", "AGL_ENGINE_MAX_MODEL_LEN", _N, _D.max_model_len),
        st.Setting("--kv-cache-gib", "AGL_ENGINE_KV_CACHE_GIB", _N, _D.kv_cache_gib,
                   "KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)"),
        st.Setting("--dtype", "AGL_ENGINE_DTYPE", st.text(nonempty=True), _D.dtype,
                   "weights' dtype (float32: the engine's log-probs equal the trainer's)"),
        st.Setting("--enforce-eager", "AGL_ENGINE_ENFORCE_EAGER", st.switch(), _D.enforce_eager,
                   "skip graph compilation (starts in ~35 s instead of ~105 s on 2 cores)"),
        st.Setting("--worker-process", "AGL_ENGINE_WORKER_PROCESS", st.switch(), _D.worker_process,
                   "run the model in a worker process of its own, as vLLM does on CPU by default (off: in the engine "
                   "core's process, VLLM_ENABLE_V1_MULTIPROCESSING=0, which starts ~25 s sooner on 2 cores)"),
        st.Setting("--python", "AGL_ENGINE_PYTHON", st.text(), _D.python, "interpreter with vLLM's CPU build "
                   "(for an installed AGL, with AGL installed in it too: pip install --no-deps)",
                   shown="this one if it has vLLM, else a checkout's .venv-engine/bin/python"),
        st.Setting("--api-key", "AGL_ENGINE_API_KEY", st.text(empty_is_none=True), _D.api_key,
                   "key vLLM requires on /v1 (given to vLLM as VLLM_API_KEY; it guards /v1 only, not the "
                   "admin routes)", secret=True),
        st.Setting("--log-level", "AGL_ENGINE_LOG_LEVEL", st.log_level(), _D.log_level),
        st.Setting("--tool-call-parser", "AGL_ENGINE_TOOL_CALL_PARSER", st.custom("a vLLM tool-call parser name, "
                   "or none", _tool_call_parser), _D.tool_call_parser,
                   "vLLM tool-call parser for requests with `tools` (hermes: the tiny model's format; none: no tools)"),
        st.Setting("--token-endpoints", "AGL_ENGINE_TOKEN_ENDPOINTS", st.switch(), _D.token_endpoints,
                   "serve vLLM's render/generate/derender endpoints (--enable-scale-out), which the proxy's token "
                   "continuation uses"),
        st.Setting("--lora-rank", "AGL_ENGINE_LORA_RANK", st.integer(0), _D.lora_rank,
                   "serve LoRA adapters up to this rank, loaded at runtime by a LoRA run's pushes (vLLM's "
                   "--enable-lora --max-lora-rank; 0: none)"),
        st.Setting("--max-loras", "AGL_ENGINE_MAX_LORAS", _N, _D.max_loras,
                   "adapters served at once (vLLM's --max-loras): one per run training on this engine"),
        st.Setting(None, "AGL_ENGINE_EXTRA_ARGS", st.shell_words(), (), "more vLLM flags, before those after `--`",
                   name="extra_args"),
    ],
)  # fmt: skip


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> EngineConfig:
    parser = SETTINGS.parser()
    parser.add_argument("vllm_args", nargs="*", help="passed to vLLM (after `--`; AGL_ENGINE_EXTRA_ARGS before them)")
    args = parser.parse_args(argv)
    values = SETTINGS.resolve(args, env)
    if not values["model_dir"]:
        SETTINGS.fail("--model-dir (or AGL_ENGINE_MODEL_DIR) is required: the Hugging Face model directory to serve")
    if values["max_loras"] != _D.max_loras and not values["lora_rank"]:
        SETTINGS.fail("--max-loras (AGL_ENGINE_MAX_LORAS) needs --lora-rank: without it the engine serves no adapter")
    return EngineConfig(**{**values, "extra_args": values["extra_args"] + tuple(args.vllm_args)})
