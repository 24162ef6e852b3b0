"""LoRA on CPU, end to end: `agl-trainer placement=cpu actor_rollout_ref.model.lora_rank=8` trains an adapter only,
writes it as a PEFT directory per version, and a real CPU vLLM started with `--lora-rank 8` loads each version
under the run's model name, which the real proxy routes the agents' calls to (issue 32).

The engine serves its base model as `agl-base` and the adapter as `agl-policy` (the trainer's agl.model_name and
the proxy's model). It is keyed (`--api-key`), as a shared engine is: the adapter routes are under /v1, so the trainer
and the proxy send its key (agl.engines.api_key and the proxy's AGL_ENGINE_API_KEY, both from the environment). The
stack is the CPU training tests' (tests/trainer/cpu_stack.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from services._gen.agl.v1 import model_pb2
from services.cli.train.lora import write_start_adapter
from services.engine.control import adapter_label
from services.proxy.engines.model_tables import MODEL_LABEL
from services.stack import local_stack
from services.trainer.run.engine_push import EnginePushError, Weights, catch_up, push_weights
from tests.support.engine import (
    Engine,
    adapter_reference_logprobs,
    build_model,
    chat,
    reference_logprobs,
    run_engine,
)
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, MODEL, TRAINER, Stack, TrainerRun, run_trainer, trainer_overrides, write_tasks

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]  # an engine start, then trainer runs

BASE = "agl-base"
ENGINE_KEY = "lora-engine-key"  # keyed, as a shared engine is: the adapter routes are under /v1
LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16"]


@pytest.fixture(scope="module")
def lora_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("lora-engine")
    with run_engine(
        build_model(root / "model"),
        model_name=BASE,
        args=["--lora-rank", "8", "--max-loras", "2"],  # two runs' adapters at once (the two-run test)
        log_dir=root,
        api_key=ENGINE_KEY,
    ) as engine:
        chat(engine, "warm up")
        yield engine


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, lora_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("lora-training"), lora_engine) as started:
        yield started


def served(engine: Engine, name: str) -> dict | None:
    cards = httpx.get(f"{engine.openai_url}/models", headers=engine.headers, timeout=30).json()["data"]
    return next((card for card in cards if card["id"] == name), None)


def held_back(stack: Stack) -> dict[str, str]:
    return httpx.get(f"{stack.proxy_url}/status", timeout=10).json()["held_back"]


def logprob_gap(engine: Engine, model: str, expected_of) -> float:
    """The largest gap between the engine's log-probs for one sampled answer under `model` and `expected_of`'s."""
    answer = chat(engine, "hello", model=model, temperature=1.0, seed=7)
    choice = answer["choices"][0]
    got = [item["logprob"] for item in choice["logprobs"]["content"]]
    expected = expected_of(answer["prompt_token_ids"], choice["token_ids"])
    return max(abs(a - b) for a, b in zip(got, expected, strict=True))


def test_lora_steps_train_the_adapter_the_engine_serves_and_a_restarted_one_is_caught_up(
    stack: Stack, lora_engine: Engine, tmp_path: Path
) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["zero", "zero", "parity", "parity", "parity", "parity"])
    run = run_trainer(stack, lora_engine, "lora3", tasks, steps=3, lr=1e-2, extra=LORA)
    assert run.returncode == 0, run.output[-5000:]
    adapter_bytes = (run.weights_dir / "adapter-v3" / "adapter_model.safetensors").stat().st_size
    base_bytes = (lora_engine.model_dir / "model.safetensors").stat().st_size
    for n in (2, 3):
        step = run.step(n)
        assert "actor/pg_loss" in step and step["agl/push/engines"] == 1.0
        # The rows were sampled through the adapter the last push loaded: the trainer's log-probs are the engine's.
        assert step["agl/push/logprob_diff_max"] < 1e-4, step
        assert step["agl/rollout/succeeded"] == 8.0
        # Only the adapter travels: its tensors, a small part of the model's.
        assert step["agl/push/bytes"] < 0.5 * base_bytes

    # Each version a PEFT directory, the last two kept; no full weights written.
    assert sorted(p.name for p in run.weights_dir.iterdir()) == ["adapter-v2", "adapter-v3"]
    tensors = load_file(str(run.weights_dir / "adapter-v3" / "adapter_model.safetensors"))
    assert tensors and all(".lora_A." in name or ".lora_B." in name for name in tensors)
    # PEFT starts B at zero: the update moved it.
    assert max(float(t.abs().max()) for name, t in tensors.items() if ".lora_B." in name) > 0.0
    assert adapter_bytes < 0.5 * base_bytes

    card = served(lora_engine, MODEL)
    assert card is not None and card["root"] == str(run.weights_dir / "adapter-v3") and card["parent"] == BASE
    model_dir = lora_engine.model_dir
    # The base model was not touched; the adapter's model is the base plus adapter v3, as transformers + PEFT say.
    assert logprob_gap(lora_engine, BASE, lambda p, r: reference_logprobs(model_dir, model_dir, p, r)) < 1e-4
    v3 = run.weights_dir / "adapter-v3"
    assert logprob_gap(lora_engine, MODEL, lambda p, r: adapter_reference_logprobs(model_dir, v3, p, r)) < 1e-4
    assert logprob_gap(lora_engine, BASE, lambda p, r: adapter_reference_logprobs(model_dir, v3, p, r)) > 1e-3

    async def registered():
        async with stack.client() as client:
            return await client.list_models(MODEL)

    (endpoint,) = asyncio.run(registered())
    assert endpoint.version == 3 and endpoint.weight_label == adapter_label(v3)

    # A restarted engine has no adapter: the proxy holds it back until the trainer's catch-up loads it again.
    unload = f"{lora_engine.url}/v1/unload_lora_adapter"
    assert httpx.post(unload, json={"lora_name": MODEL}, timeout=30).status_code == 401  # the key is needed
    response = httpx.post(unload, json={"lora_name": MODEL}, headers=lora_engine.headers, timeout=30)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 30
    while lora_engine.openai_url not in (held := held_back(stack)):
        assert time.monotonic() < deadline, held
        time.sleep(0.5)
    assert "'adapter:none'" in held[lora_engine.openai_url]

    async def caught_up() -> list[str]:
        async with stack.client() as client:
            weights = Weights(run.weights_dir, adapter=True, api_key=ENGINE_KEY)
            return await catch_up(client, MODEL, weights, 3, await client.list_models(MODEL))

    assert asyncio.run(caught_up()) == [lora_engine.openai_url]
    assert served(lora_engine, MODEL)["root"] == str(v3)
    deadline = time.monotonic() + 30
    while lora_engine.openai_url in (held := held_back(stack)):
        assert time.monotonic() < deadline, held
        time.sleep(0.5)


def test_an_adapter_over_the_engines_rank_fails_the_run_and_leaves_the_loaded_one(
    stack: Stack, lora_engine: Engine, tmp_path: Path
) -> None:
    before = (served(lora_engine, MODEL) or {}).get("root")
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 2)
    extra = ["actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32"]
    run = run_trainer(stack, lora_engine, "lora16", tasks, steps=1, lr=1e-3, extra=extra)
    assert run.returncode != 0
    assert "LoRA rank 16 is greater than max_lora_rank 8" in run.output, run.output[-3000:]
    # vLLM checks the adapter before it evicts the loaded one: what was served still is.
    assert (served(lora_engine, MODEL) or {}).get("root") == before


def test_an_engine_without_lora_is_one_clear_error(stack: Stack, cpu_engine: Engine, tmp_path: Path) -> None:
    """The push of a LoRA run to an engine started without `--lora-rank` (the session's plain engine). How the
    trainer fails its step on a refused push is the rank test's above; this is the error an operator reads."""
    weights = tmp_path / "weights"
    (weights / "adapter-v1").mkdir(parents=True)
    plain = model_pb2.ModelEndpoint(model_name=MODEL, endpoint=cpu_engine.openai_url)

    async def push() -> None:
        async with stack.client() as client:
            await push_weights(client, MODEL, Weights(weights, adapter=True), 1, endpoints=[plain])

    with pytest.raises(EnginePushError, match=r"does not load LoRA adapters at runtime: start it with `--lora-rank R`"):
        asyncio.run(push())
    # Nothing half-loaded: the engine serves its one model as before.
    assert [card["id"] for card in httpx.get(f"{cpu_engine.openai_url}/models", timeout=30).json()["data"]] == [
        cpu_engine.model_name
    ]


def test_an_adapter_of_another_base_model_is_refused_and_nothing_is_loaded(
    stack: Stack, lora_engine: Engine, tmp_path: Path
) -> None:
    """vLLM checks an adapter's rank and modules, not its base: this one has the engine model's shapes and names
    another base model in its PEFT config, as an adapter trained on a sibling checkpoint would."""
    weights = tmp_path / "weights"
    adapter = write_start_adapter(lora_engine.model_dir, weights / "adapter-v1", rank=8, alpha=16)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "/models/another-base"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    shared = model_pb2.ModelEndpoint(model_name="other-run", endpoint=lora_engine.openai_url)

    async def push() -> None:
        async with stack.client() as client:
            await push_weights(
                client, "other-run", Weights(weights, adapter=True, api_key=ENGINE_KEY), 1, endpoints=[shared]
            )

    with pytest.raises(EnginePushError, match=r"trained on base model /models/another-base, the engine serves "):
        asyncio.run(push())
    assert served(lora_engine, "other-run") is None  # nothing loaded under that name


@pytest.mark.two_runs
def test_two_runs_train_their_own_adapters_on_one_engine_and_proxy(
    stack: Stack, lora_engine: Engine, tmp_path: Path
) -> None:
    """Two LoRA runs at once against one ledger, one proxy and one engine (issue 32 item 3): each run's rollouts
    are labelled with its model, the proxy serves each through its own run's adapter, and each run's pause holds
    only its own calls (pause_scope=model). Every recorded call of a run names its adapter and one of its versions,
    and each run's engine/trainer log-prob gap stays below 1e-4."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 4)
    names = {"pair-a": MODEL, "pair-b": f"{MODEL}-b"}

    async def register_b() -> None:
        async with stack.client() as client:
            await client.register_models([model_pb2.ModelEndpoint(model_name=names["pair-b"],
                                                                  endpoint=lora_engine.openai_url)])  # fmt: skip

    asyncio.run(register_b())
    lora_engine.restore_base_weights()
    env = local_stack.child_environment({"AGL_ENGINE_API_KEY": ENGINE_KEY})
    runs: dict[str, TrainerRun] = {}
    with contextlib.ExitStack() as logs:
        started: dict[str, tuple[subprocess.Popen, Path]] = {}
        for run_id, model in names.items():
            out = stack.root / run_id
            out.mkdir()
            argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
            argv += trainer_overrides(lora_engine, run_id, tasks, out, steps=2, lr=1e-2, model=model)
            argv += [*LORA, "agl.async_training.pause_scope=model", "agl.retention.keep_steps=-1"]
            log = logs.enter_context((out / "trainer.log").open("w"))
            env_run = {**env, "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")}
            started[run_id] = (subprocess.Popen(argv, env=env_run, stdout=log, stderr=subprocess.STDOUT), out)
        for run_id, (process, out) in started.items():
            code = process.wait(timeout=900)
            runs[run_id] = TrainerRun.read(code, (out / "trainer.log").read_text(), out)
    for run_id, run in runs.items():
        assert run.returncode == 0, (run_id, run.output[-5000:])
        for n in (1, 2):
            assert run.step(n)["agl/push/logprob_diff_max"] < 1e-4, (run_id, run.step(n))
            assert run.step(n)["agl/rollout/succeeded"] == 8.0, (run_id, run.step(n))
        assert sorted(p.name for p in run.weights_dir.iterdir()) == ["adapter-v1", "adapter-v2"]

    async def calls_by_run() -> dict[str, set[tuple[str, int]]]:
        seen: dict[str, set[tuple[str, int]]] = {}
        async with stack.client() as client:
            for run_id, model in names.items():
                rollouts = await client.list_rollouts(labels={"agl_run": run_id})
                assert len(rollouts) == 16 and {r.metadata.labels[MODEL_LABEL] for r in rollouts} == {model}
                for rollout in rollouts:
                    for event in await client.list_events(rollout.rollout_id, event_type="model_request"):
                        seen.setdefault(run_id, set()).add(
                            (event.model_request.model, event.model_request.model_version)
                        )
        return seen

    seen = asyncio.run(calls_by_run())
    # Step n's rollouts were served by the adapter of version n - 1 (the start push is version 0), each run's own.
    assert seen == {"pair-a": {(MODEL, 0), (MODEL, 1)}, "pair-b": {(names["pair-b"], 0), (names["pair-b"], 1)}}
    cards = {card["id"]: card for card in httpx.get(f"{lora_engine.openai_url}/models", headers=lora_engine.headers,
                                                    timeout=30).json()["data"]}  # fmt: skip
    for run_id, model in names.items():
        assert cards[model]["root"] == str(runs[run_id].weights_dir / "adapter-v2")
