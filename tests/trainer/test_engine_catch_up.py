"""An engine restarted mid-run gets the current weights before the next step (engine_push.catch_up), against the
real ledger and the real CPU engine.

The restart is what the trainer can observe of one: the engine serves its base model again and labels its weights
"default" (vLLM's label at start-up), while the registry still lists it at the run's version."""

from __future__ import annotations

from pathlib import Path

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.trainer.run.engine_push import catch_up, push_weights
from tests.support.engine import Engine, chat, reference_logprobs, write_perturbed_weights
from tests.support.procs import free_port, start_ledger

MODEL = "caught-up"


def served_gap(engine: Engine, weights: Path) -> float:
    """The largest gap between the engine's log-probs of a sampled answer and transformers' on `weights`."""
    answer = chat(engine, "What is 17 + 25?", max_tokens=16, temperature=1.0, seed=3)
    (choice,) = answer["choices"]
    served = [e["logprob"] for e in choice["logprobs"]["content"]]
    expected = reference_logprobs(engine.model_dir, weights, answer["prompt_token_ids"], choice["token_ids"])
    return max(abs(a - b) for a, b in zip(served, expected, strict=True))


async def restart_state(engine: Engine) -> None:
    """The engine as a restart leaves it: its base model, vLLM's start-up label."""
    async with engine.control() as control:
        await control.reload_weights(engine.model_dir)
        await control.reset_prefix_cache()
        await control.set_weight_version("default")


async def test_a_restarted_engine_is_pushed_the_current_weights_and_a_current_one_is_left_alone(
    cpu_engine: Engine, tmp_path: Path
) -> None:
    weights = write_perturbed_weights(cpu_engine.model_dir, tmp_path / "weights", seed=3)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    try:
        with start_ledger(store="memory") as ledger:
            async with LedgerClient(ledger.address) as client:
                await client.register_models(
                    [model_pb2.ModelEndpoint(model_name=MODEL, endpoint=cpu_engine.openai_url)]
                )
                await push_weights(client, MODEL, weights, 3)
                assert served_gap(cpu_engine, weights) < 1e-4
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=dead, version=3)])
                endpoints = await client.list_models(MODEL)

                # Every engine current (the dead one does not answer: left to the proxies' failover): nothing pushed.
                assert await catch_up(client, MODEL, weights, 3, endpoints) == []

                # The engine restarts: base weights, vLLM's start-up label; the registry still says version 3.
                await restart_state(cpu_engine)
                assert served_gap(cpu_engine, weights) > 0.01
                assert await catch_up(client, MODEL, weights, 3, endpoints) == [cpu_engine.openai_url]
                assert served_gap(cpu_engine, weights) < 1e-4
                async with cpu_engine.control() as control:
                    assert await control.weight_version() == "3"
                assert await catch_up(client, MODEL, weights, 3, endpoints) == []

                # Registered again by hand at version 0 while serving version 3: the record is put right, no push.
                await client.register_models(
                    [model_pb2.ModelEndpoint(model_name=MODEL, endpoint=cpu_engine.openai_url, version=0)]
                )
                assert await catch_up(client, MODEL, weights, 3, await client.list_models(MODEL)) == []
                versions = {e.endpoint: e.version for e in await client.list_models(MODEL)}
                assert versions[cpu_engine.openai_url] == 3

                # Before the first update there is nothing to catch up with.
                assert await catch_up(client, MODEL, tmp_path / "empty", 0, endpoints) == []

                # A push while one engine is dead: the live one takes the weights; the dead one is registered at the
                # new version under a label no engine reports (the proxies hold it back) until a catch-up reaches it.
                pushed = await push_weights(client, MODEL, weights, 4)
                assert pushed.endpoints == [cpu_engine.openai_url] and pushed.deferred == [dead]
                labels = {e.endpoint: (e.version, e.weight_label) for e in await client.list_models(MODEL)}
                assert labels == {cpu_engine.openai_url: (4, "4"), dead: (4, "pending 4")}
                async with cpu_engine.control() as control:
                    assert await control.weight_version() == "4"
    finally:
        await restart_state(cpu_engine)
