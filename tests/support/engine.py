"""The real CPU vLLM engine for tests: a tiny model made here, served by `python -m services.engine` from the
checkout's .venv-engine on a free loopback port, stopped with its whole process group.

A pytest plugin (registered in tests/conftest.py): the session-scoped `cpu_engine` fixture starts ONE engine
per pytest session for every test folder that asks for it (a start costs ~45 s and ~3 GB). Tests that reload
other weights into it put the base weights back when they finish (`restore_base_weights`).
A missing .venv-engine fails the test with the command that makes it; it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.engine.control import EngineControl
from services.engine.launch import INSTALLED_SENTINEL
from tests.support.procs import REPO_ROOT, free_port

ENGINE_PYTHON = REPO_ROOT / ".venv-engine" / "bin" / "python"
MODEL_NAME = "agl-policy"
START_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Engine:
    """A running engine: `url` is the server root, `openai_url` what a client or the ledger registry takes."""

    url: str
    model_dir: Path
    model_name: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    api_key: str | None = None  # what its /v1 routes want (`--api-key`); None: nothing

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def control(self) -> EngineControl:
        return EngineControl(self.url, api_key=self.api_key)

    def restore_base_weights(self) -> None:
        """Reloads the weights the engine started with (from synchronous code, e.g. a fixture's teardown)."""

        async def restore() -> None:
            async with self.control() as control:
                await control.reload_weights(self.model_dir)
                await control.reset_prefix_cache()

        asyncio.run(restore())


def require_engine_venv(python: Path = ENGINE_PYTHON) -> Path:
    """The engine venv's interpreter; a missing or half-installed venv fails the test (never a skip)."""
    if not python.is_file() or not (python.parents[1] / INSTALLED_SENTINEL).is_file():
        pytest.fail(f"the CPU vLLM engine's venv is missing ({python}): run `make engine-venv` first", pytrace=False)
    return python


def build_model(directory: Path, **kwargs: int) -> Path:
    """The tiny Qwen2-shaped model (services.engine.tiny_model), built in this (the main) venv."""
    from services.engine.tiny_model import build_tiny_model

    return build_tiny_model(directory, **kwargs)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2.0) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError) as err:
            last = err
        time.sleep(0.25)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f}s: {last}")


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """SIGTERM to the engine's process group (API server and engine-core worker), SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)
    # The worker may outlive the server by a moment; whatever is left of the group goes now.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def run_engine(
    model_dir: Path,
    *,
    model_name: str = MODEL_NAME,
    args: Sequence[str] = (),
    log_dir: Path | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    port: int = 0,
    api_key: str | None = None,
) -> Iterator[Engine]:
    """Starts the engine the way a user does (`python -m services.engine`), waits for /health, stops it after.
    `port`: the engine's port (a restart on the same one); a free one by default. `api_key`: its /v1 routes want it."""
    python = require_engine_venv()
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "services.engine", "--model-dir", str(model_dir), "--python", str(python)]
    argv += ["--served-model-name", model_name, "--host", "127.0.0.1", "--port", str(port), *args]
    if api_key:
        argv += ["--api-key", api_key]
    directory = Path(log_dir or tempfile.mkdtemp(prefix="agl-engine-"))
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"engine-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "VLLM_"))}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
        )
    engine = Engine(
        url=url, model_dir=Path(model_dir), model_name=model_name, log_path=log_path, proc=proc, api_key=api_key
    )
    try:
        try:
            _wait_healthy(url, proc, start_timeout_s)
        except Exception as err:
            log = engine.log_text()
            raise RuntimeError(f"engine did not become healthy: {err}\n--- engine log ---\n{log}") from err
        yield engine
    finally:
        _stop_group(proc)


@pytest.fixture(scope="session")
def cpu_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One real CPU vLLM engine serving the tiny model (served as `agl-policy`) for the whole pytest session."""
    require_engine_venv()
    root = tmp_path_factory.mktemp("cpu-engine")
    model_dir = build_model(root / "model")
    with run_engine(model_dir, log_dir=root) as engine:
        # Its first request compiles the sampler (~20 s on 2 cores): longer than an agent waits for an answer, so
        # whichever test came first would see its first rollouts time out.
        chat(engine, "warm up")
        yield engine


CALC_TASKS_SEED = 11  # the tasks build_calc_model warm-starts on: make_tasks(12, seed=CALC_TASKS_SEED)
CALC_TOOL_SHARE = 0.8  # the share of them it learns to solve with the tool (warm_start_examples, seed 0)


def calc_tasks_solved_with_the_tool() -> list[dict[str, Any]]:
    """The warm-start tasks whose transcript calls the tool: on these the calc model opens with a call."""
    from examples.calc_agent.tasks import make_tasks, warm_start_examples

    tasks = make_tasks(12, seed=CALC_TASKS_SEED)
    examples = warm_start_examples(tasks, tool_share=CALC_TOOL_SHARE, seed=0)
    called = {messages[-1]["content"] for messages, answer in examples if answer.startswith("<tool_call>")}
    return [task for task in tasks if task["question"] in called]


def build_calc_model(directory: Path, *, tool_share: float = CALC_TOOL_SHARE, steps: int = 150) -> Path:
    """A tiny model for the calc agent (examples/calc_agent): its tokenizer learned from the calculator prompts and
    calls, warm-started on the transcripts of a dozen tasks, most of them solved with the tool. It calls the
    tool most of the time and is sometimes right: what the tool-call and multi-turn training tests need."""
    from examples.calc_agent.tasks import TOOLS, make_tasks, tokenizer_corpus, warm_start_examples
    from services.engine.tiny_model import build_tiny_model
    from services.engine.warm_start import warm_start

    tasks = make_tasks(12, seed=CALC_TASKS_SEED)
    build_tiny_model(directory, corpus=tokenizer_corpus(tasks))
    examples = warm_start_examples(tasks, tool_share=tool_share, seed=0)
    warm_start(directory, examples, steps=steps, batch_size=16, lr=2e-3, tools=TOOLS)
    return Path(directory)


@pytest.fixture(scope="session")
def calc_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A second CPU engine, serving the calc agent's tiny model (build_calc_model) with the hermes tool-call
    parser (the engine's default): tools offered, calls parsed, one session-wide start."""
    require_engine_venv()
    root = tmp_path_factory.mktemp("calc-engine")
    model_dir = build_calc_model(root / "model")
    with run_engine(model_dir, log_dir=root) as engine:
        chat(engine, "warm up")
        yield engine


def chat(engine: Engine, content: str, **body: Any) -> dict[str, Any]:
    """One chat completion straight to the engine, with token ids and log-probs returned."""
    request = {
        "model": engine.model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "logprobs": True,
        "return_token_ids": True,
        **body,
    }
    response = httpx.post(f"{engine.openai_url}/chat/completions", json=request, headers=engine.headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def write_perturbed_weights(model_dir: Path, out_dir: Path, *, scale: float = 0.05, seed: int = 1) -> Path:
    """A copy of model_dir's weights (model.safetensors only, as a trainer writes them) plus seeded noise."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(Path(model_dir) / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    noisy = {name: (t + scale * torch.randn(t.shape, generator=generator)).contiguous() for name, t in weights.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def reference_logprobs(
    model_dir: Path, weights_dir: Path, prompt_ids: Sequence[int], response_ids: Sequence[int]
) -> list[float]:
    """Hugging Face transformers' fp32 log-probs of response_ids after prompt_ids, with weights_dir's weights."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_file(str(Path(weights_dir) / "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return _logprobs_of(model, prompt_ids, response_ids)


def adapter_reference_logprobs(
    model_dir: Path, adapter_dir: Path, prompt_ids: Sequence[int], response_ids: Sequence[int]
) -> list[float]:
    """transformers' fp32 log-probs of response_ids after prompt_ids, model_dir's model with the PEFT adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return _logprobs_of(PeftModel.from_pretrained(base, str(adapter_dir)), prompt_ids, response_ids)


def _logprobs_of(model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
    import torch

    model.eval()
    ids = torch.tensor([[*prompt_ids, *response_ids]])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(response_ids) - 1)
    logprobs = torch.log_softmax(logits[positions], dim=-1)
    return logprobs.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0].tolist()
