"""Agent Lightning v1.0's own clients, unchanged, against AGL (issue 27): its local controller, its trainer's HTTP
layer (a simulated step: register, enqueue with pre-assigned ids, wait, terminal cursor, `format=triplet`, delete,
and the gateway's pause/drain/resume around the update) and its example agents (gsm8k with the OpenAI SDK, calc_x
with AutoGen and the MCP calculator server) through AGL's controller and proxy. v1.0's code runs in its own venv;
what it reports is checked here against the ledger's gRPC view and the stand-in engine's request log."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token

from .conftest import (
    CLIENTS,
    KEY,
    MODEL,
    Agl1,
    Stack,
    agl_controller,
    http,
    registered_stack,
    run_json,
    start_v1,
    v1_controller,
)

GSM8K = {"question": ["What is 6 * 7?", "What is 10 - 3?"], "answer": ["42", "8"]}
GSM8K_ENV = {"QUESTION": "input.question", "ANSWER": "input.answer"}


def ledger(stack: Stack) -> LedgerClient:
    return LedgerClient(stack.ledger.address, KEY)


async def models(stack: Stack) -> list[Any]:
    async with ledger(stack) as client:
        return list(await client.list_models())


async def remaining(stack: Stack, rollout_ids: list[str]) -> list[str]:
    async with ledger(stack) as client:
        return [r.rollout_id for r in await client.list_rollouts() if r.rollout_id in set(rollout_ids)]


def engine_calls(stack: Stack) -> list[dict[str, Any]]:
    return httpx.get(f"{stack.engine.url}/standin/requests").json()["received"]


def clear_engine_log(stack: Stack) -> None:
    httpx.delete(f"{stack.engine.url}/standin/requests").raise_for_status()


def step_spec(stack: Stack, agent_class: str) -> dict[str, Any]:
    return {
        "base_url": stack.proxy.url,
        "key": KEY,
        "model": MODEL,
        "engine": stack.engine_address,
        "agent_class": agent_class,
        "env_map": GSM8K_ENV,
        "data": GSM8K,
        "n": 2,
        "timeout_s": 120,
    }


def check_step(stack: Stack, answer: dict[str, Any], attempt: str | None) -> None:
    """What v1.0's trainer got from a step: every rollout succeeded with its reward on its one triplet, the terminal
    cursor gave every followed rollout once, and the deletes left nothing behind."""
    assert answer["registered"] == [{"model": MODEL, "endpoint": f"{stack.engine.url}/v1", "version": 0}]
    completed, followed = answer["completed"], answer["followed"]
    assert len(completed) == 4 and len(followed) == 2
    for rollout in completed + followed:
        assert rollout["state"] == "succeeded", rollout
        assert rollout["finished_at"] is not None
        assert rollout["event_types"] == ["model_request", "reward"], rollout
        (triplet,) = rollout["triplets"]
        assert triplet["prompt_ids"] and triplet["response_ids"] and triplet["server"]["model"] == MODEL
        assert triplet["reward"] == rollout["final_reward"]
        if attempt is not None:
            assert rollout["attempts"] == [attempt]
    # The sync loop saw each rollout running (the server's updated_at at the claim) before it ended.
    assert all(r["running_at"] is not None and r["finished_at"] >= r["running_at"] for r in completed)
    # The stand-in answers 6 * 7 right and 10 - 3 as 7: gsm8k_agent's own scoring gives 1.0 and 0.0.
    expected = {"42": 1.0, "8": 0.0}
    assert all(r["final_reward"] == expected[r["input"]["answer"]] for r in completed + followed)
    assert sorted(r["input"]["answer"] for r in completed) == ["42", "42", "8", "8"]
    # Train rollouts carry the engine's log-probs for every sampled token; validation ones ask for none (as in v1.0).
    for rollout in completed:
        (triplet,) = rollout["triplets"]
        assert len(triplet["log_probs"]) == len(triplet["response_ids"])
    assert all(r["triplets"][0]["log_probs"] is None for r in followed)
    # Two rollouts per sample share the sample's data id.
    groups = {
        r["data_id"]: {x["input"]["answer"] for x in completed if x["data_id"] == r["data_id"]} for r in completed
    }
    assert len(groups) == 2 and all(len(answers) == 1 for answers in groups.values())
    assert all(sum(x["data_id"] == data_id for x in completed) == 2 for data_id in groups)
    ids = sorted(r["rollout_id"] for r in followed)
    assert [item["rollout_id"] for item in answer["terminal_items"]] == ids
    assert all(item["state"] == "succeeded" and item["is_train"] is False for item in answer["terminal_items"])
    assert answer["cursors"] == sorted(answer["cursors"])
    assert answer["after_delete"] == [404] * 6 and answer["deleted_models"] == {"status": "ok"}
    every = [r["rollout_id"] for r in completed + followed]
    assert not asyncio.run(remaining(stack, every)) and not asyncio.run(models(stack))


def test_v1_local_controller_runs_v1_trainers_step_against_agl(agl1: Agl1, stack: Stack, tmp_path: Path) -> None:
    """v1.0 end to end with AGL in the middle: its controller launches its gsm8k example agent for the rollouts its
    trainer's rollout manager enqueues; AGL's proxy forwards and records every call."""
    clear_engine_log(stack)
    spec = {**step_spec(stack, "gsm8k_agent.ChatAgent"), "hooks": str(CLIENTS / "note_hooks.py")}
    with v1_controller(agl1, stack, tmp_path, ["gsm8k"]) as controller:
        answer = run_json(agl1, tmp_path, "trainer_step.py", spec)
        assert controller.alive(), controller.log_text()[-4000:]
    check_step(stack, answer, attempt="0")  # v1.0's controller runs every rollout as attempt "0"
    # Its hooks: on_enqueue's label is on every rollout; on_succeeded's write-back after the end is refused (409,
    # docs/reference/v1-compat.md's differences), and v1.0's hook runner reports it and goes on: the step still
    # completed.
    assert all(r["metadata"]["labelled_by"] == "on_enqueue" for r in answer["completed"])
    assert answer["output"].count("on_succeeded hook failed") == 4 and "409 Conflict" in answer["output"]
    calls = engine_calls(stack)
    assert len(calls) == 6  # one chat call per rollout, each recorded (the triplets above) and none twice
    assert all(c["body"]["model"] == MODEL and c["body"].get("return_token_ids") for c in calls)


def test_v1_examples_run_unmodified_through_agls_controller(agl1: Agl1, stack: Stack, tmp_path: Path) -> None:
    """The migration: v1.0's trainer and example agents, AGL's controller. gsm8k's agent class runs in AGL's
    controller (its rollouts enqueued by v1.0's rollout manager); calc_x runs as its own Job template runs it
    (`python calc_agent.py`), AutoGen calling the MCP calculator server the stand-in's tool call asks for."""
    with agl_controller(agl1, stack, tmp_path, ["gsm8k", "calc_x"]) as controller:
        clear_engine_log(stack)
        answer = run_json(agl1, tmp_path, "trainer_step.py", step_spec(stack, "gsm8k_agent.ChatAgent"))
        check_step(stack, answer, attempt=None)
        assert len(engine_calls(stack)) == 6  # one call per rollout, each captured once (the triplets above)
        assert all(r["attempts"] != ["0"] for r in answer["completed"])  # AGL's own attempt ids

        registered_stack(stack)
        clear_engine_log(stack)
        calc = [
            {"question": "What is 12 * 7?", "result": "84"},
            {"question": "What is 3 + 4?", "result": "7"},
        ]
        rollout_ids = [uuid.uuid4().hex for _ in calc]
        body = [
            {
                "rollout_id": rollout_id,
                "input": question,
                "is_train": True,
                "config": {
                    "timeout_seconds": 120,
                    "local": {
                        "command": [str(agl1.python), str(agl1.examples / "calc_x" / "calc_agent.py")],
                        "env_map": {"QUESTION": "input.question", "RESULT": "input.result"},
                    },
                },
            }
            for rollout_id, question in zip(rollout_ids, calc, strict=True)
        ]
        with http(stack) as client:
            assert client.post("/api/rollouts", json=body).status_code == 201
            deadline = time.monotonic() + 180
            while True:
                states = [client.get(f"/api/rollouts/{rid}").json()["rollout"]["status"] for rid in rollout_ids]
                if all(s["state"] in ("succeeded", "failed") for s in states):
                    break
                assert time.monotonic() < deadline, states
                time.sleep(0.5)
            assert [s["state"] for s in states] == ["succeeded", "succeeded"], (states, controller.log_text()[-3000:])
            listings = [client.get(f"/api/rollouts/{rid}/events").json() for rid in rollout_ids]
            triplets = [
                client.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json() for rid in rollout_ids
            ]
    calls = engine_calls(stack)
    # Each calc_x rollout: the model asks for the calculator, AutoGen runs it over MCP, the model reflects on the
    # result; both calls recorded, then the agent's reward.
    assert len(calls) == 4
    for listing, question in zip(listings, calc, strict=True):
        assert [e["event_type"] for e in listing] == ["model_request", "model_request", "reward"]
        first, second = listing[0]["data"], listing[1]["data"]
        (tool_call,) = first["response"]["choices"][0]["message"]["tool_calls"]
        assert tool_call["function"]["name"] == "calculate"
        tool_message = next(m for m in second["request"]["messages"] if m["role"] == "tool")
        assert question["result"] in tool_message["content"]  # the MCP server's answer went back to the model
        assert listing[2]["data"]["value"] in (0.0, 1.0)
    for events in triplets:
        calls_seen = [e for e in events if e["event_type"] == "model_request"]
        assert len(calls_seen) == 2 and all(c["data"]["response_token_ids"] for c in calls_seen)


def test_v1_trainer_pauses_drains_and_resumes_agls_gateway(agl1: Agl1, stack: Stack, tmp_path: Path) -> None:
    """v1.0's async trainer around a weight update: its own pause-and-drain returns only once the call in flight
    has ended, and its resume lets calls through again."""
    registered_stack(stack)
    rollout_id = f"ro-{uuid.uuid4().hex[:10]}"

    async def running() -> None:
        async with ledger(stack) as client:
            spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
            await client.create_rollouts([spec])
            await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")

    asyncio.run(running())
    url = f"{stack.proxy.url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1/chat/completions"
    headers = {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}
    slow_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "standin": {"delay_ms": 1500}}
    finished: dict[str, Any] = {}

    def slow_call() -> None:
        reply = httpx.post(url, json=slow_body, headers=headers, timeout=30)
        finished.update(status=reply.status_code, at=time.time())

    out = tmp_path / "drain.json"
    driver = start_v1(agl1, "gateway_drain.py", stack.proxy.url, KEY, str(out))
    try:
        assert driver.stdout is not None and driver.stdin is not None
        assert driver.stdout.readline().strip() == "ready", driver.communicate(timeout=30)[0]
        caller = threading.Thread(target=slow_call)
        caller.start()
        deadline = time.monotonic() + 10
        while httpx.get(f"{stack.proxy.url}/status").json()["in_flight"] < 1:  # the call is at the engine
            assert time.monotonic() < deadline and caller.is_alive(), finished
            time.sleep(0.02)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        output = driver.communicate(timeout=60)[0]
        assert driver.returncode == 0, output
    finally:
        driver.kill()
    caller.join(30)
    answer = json.loads(out.read_text())
    metrics = answer["metrics"]
    assert metrics["training/async/proxy_inflight_at_pause"] >= 1, (answer, finished)
    assert finished["status"] == 200 and finished["at"] <= answer["drained_at"]
    assert metrics["training/async/proxy_drain_seconds"] > 0.3
    assert answer["paused_state"] == {
        "paused": True,
        "retry_after_seconds": 5,
        "reason": "weights update",
        "inflight": 0,
    }
    assert answer["resumed_state"]["paused"] is False and answer["resumed_state"]["inflight"] == 0
    after = httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, headers=headers)
    assert after.status_code == 200

    async def recorded() -> list[event_pb2.Event]:
        async with ledger(stack) as client:
            return list(await client.list_events(rollout_id, event_type="model_request"))

    assert len(asyncio.run(recorded())) == 2
