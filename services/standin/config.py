"""Settings of the stand-in engine: one frozen object built from flags, with AGL_STANDIN_* env-var defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services import settings as st


@dataclass(frozen=True)
class StandinConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "standin-model"
    max_model_len: int = 32768
    delay_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    fail_first: int = 0
    fail_status: int = 503
    mistake_rate: float = 0.0
    weight_version: str = ""
    lora_modules: str = ""
    scale_out: bool = False
    log_level: str = "warning"


_D = StandinConfig()
_MS = st.number(0.0, what="a number of milliseconds")
SETTINGS = st.Settings(
    "agl-standin-engine",
    __doc__,
    [
        st.Setting("--host", "AGL_STANDIN_HOST", st.text(), _D.host),
        st.Setting("--port", "AGL_STANDIN_PORT", st.port(), _D.port),
        st.Setting("--model", "AGL_STANDIN_MODEL", st.text(nonempty=True), _D.model, "served model name"),
        st.Setting("--max-model-len", "AGL_STANDIN_MAX_MODEL_LEN", st.integer(1), _D.max_model_len,
                   "context length in tokens, reported by GET /v1/models; as vLLM, a max_tokens above it and a "
                   "prompt longer than it are refused, any other limit is lowered to what the prompt leaves"),
        st.Setting("--delay-ms", "AGL_STANDIN_DELAY_MS", _MS, _D.delay_ms,
                   "wait before each answer (before the first chunk when streaming)"),
        st.Setting("--chunk-delay-ms", "AGL_STANDIN_CHUNK_DELAY_MS", _MS, _D.chunk_delay_ms,
                   "wait between stream chunks"),
        st.Setting("--fail-first", "AGL_STANDIN_FAIL_FIRST", st.integer(0), _D.fail_first,
                   "answer the first N generation requests with --fail-status"),
        st.Setting("--fail-status", "AGL_STANDIN_FAIL_STATUS", st.integer(400, 599, what="an HTTP error status"),
                   _D.fail_status),
        st.Setting("--mistake-rate", "AGL_STANDIN_MISTAKE_RATE", st.number(0.0, 1.0), _D.mistake_rate,
                   "when sampling (temperature > 0), answer this fraction of arithmetic questions off by one"),
        st.Setting("--weight-version", "AGL_STANDIN_WEIGHT_VERSION", st.text(), _D.weight_version,
                   "serve vLLM's dev-mode weight label routes (GET /weight_info, POST /update_weight_version) "
                   "starting at this label (vLLM's own first label is `default`); empty: no such routes, as vLLM "
                   "without VLLM_SERVER_DEV_MODE"),
        st.Setting("--lora-modules", "AGL_STANDIN_LORA_MODULES", st.text(), _D.lora_modules,
                   "adapters served beside the model, NAME=PATH[,NAME=PATH...] as vLLM's --lora-modules: a call "
                   "naming one is answered as that model, GET /v1/models lists each with its path, and "
                   "POST /v1/load_lora_adapter loads (or replaces) one"),
        st.Setting("--scale-out", "AGL_STANDIN_SCALE_OUT", st.switch(), _D.scale_out,
                   "serve vLLM's split chat path (POST /v1/chat/completions/render, /inference/v1/generate, "
                   "/v1/chat/completions/derender), as vLLM started with --enable-scale-out"),
        st.Setting("--log-level", "AGL_LOG_LEVEL", st.log_level(), _D.log_level),
    ],
)  # fmt: skip


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> StandinConfig:
    values = SETTINGS.parse(argv, env)
    for module in filter(None, values["lora_modules"].split(",")):
        if "=" not in module or not module.partition("=")[0]:
            SETTINGS.fail(f"--lora-modules: {module!r} is not NAME=PATH")
    return StandinConfig(**{**values, "log_level": values["log_level"].lower()})  # uvicorn wants it lower-case
