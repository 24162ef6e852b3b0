"""The whole stack as separate processes, started like compose: enqueue rollouts, the controller runs the
unmodified example agents, the proxy records their calls to the stand-in engine, rewards land, the terminal
stream delivers trajectories with the engine's token ids, and consumed rollouts are deleted."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.standin import model as standin_model
from services.standin.tokenizer import ToyTokenizer, token_logprob
from tests.e2e.conftest import CALC_AGENT, MATH_AGENT, Stack, run_to_end, spec

SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED


def _calls(entry: Any) -> list[event_pb2.ModelRequest]:
    return [e.model_request for e in entry.events if e.event_type == "model_request"]


def _rewards(entry: Any) -> list[float]:
    return [e.reward.value for e in entry.events if e.event_type == "reward"]


def _engine_output(request: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """What the stand-in engine produces for this request, recomputed from its tokenizer and toy model."""
    tokenizer = ToyTokenizer()
    messages, tools = request["messages"], request.get("tools")
    prompt = tokenizer.encode(standin_model.render_chat(messages, tools))
    reply = standin_model.chat_reply(messages, tools, request.get("tool_choice", "auto"))
    response = tokenizer.encode(reply.raw)
    return prompt, response, [token_logprob(token, position) for position, token in enumerate(response)]


async def _assert_tokens_are_the_engines(client: Any, entry: Any) -> list[dict[str, Any]]:
    """Triplet token ids == what the engine returned (recorded response) == the engine recomputed."""
    full = await client.list_events(entry.rollout.rollout_id, event_type="model_request")
    triplets = _calls(entry)
    assert len(full) == len(triplets) >= 1
    requests = []
    for event, triplet in zip(full, triplets, strict=True):
        recorded = event.model_request
        request, response = json.loads(recorded.request_json), json.loads(recorded.response_json)
        prompt, output, logprobs = _engine_output(request)
        assert list(triplet.prompt_token_ids) == prompt
        assert list(triplet.response_token_ids) == output
        assert triplet.has_response_logprobs and list(triplet.response_logprobs) == logprobs
        assert list(recorded.response_token_ids) == output
        assert response["choices"][0]["token_ids"] == output
        assert response["prompt_token_ids"] == prompt
        requests.append({"request": request, "response": response})
    return requests


async def test_math_agent_in_grpo_groups(stack: Stack) -> None:
    run = f"math-{uuid.uuid4().hex[:8]}"
    tasks = [
        {"id": "m0", "question": "What is 12 + 7?", "answer": "19"},
        {"id": "m1", "question": "What is 90 - 99?", "answer": "-9"},
    ]
    specs = [
        spec(run, f"g{i}-{k}", task, agent_class=MATH_AGENT, group=f"g{i}")
        for i, task in enumerate(tasks)
        for k in range(2)
    ]
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, specs)
        for rollout_id, entry in entries.items():
            assert entry.rollout.status.state == SUCCEEDED, (rollout_id, entry.rollout.status.error_message)
            assert _rewards(entry) == [1.0]
            assert len(_calls(entry)) == 1
            assert entry.events[-1].event_type == "reward"  # recorded after the call it rewards
            (exchange,) = await _assert_tokens_are_the_engines(client, entry)
            question = json.loads(entry.rollout.input_json)["question"]
            assert exchange["request"]["messages"][-1] == {"role": "user", "content": question}
            assert exchange["request"]["model"] == "agl-policy"
        groups = {entry.rollout.metadata.labels["group"] for entry in entries.values()}
        assert groups == {"g0", "g1"}
        cursors = sorted(entry.cursor for entry in entries.values())
        assert len(set(cursors)) == len(cursors)

        deleted = await client.delete_rollouts(list(entries))
        assert deleted == len(entries)
        for rollout_id in entries:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.get_rollout(rollout_id)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert await client.list_rollouts(labels={"run": run}) == []


async def test_calc_agent_calls_its_tool_over_several_turns(stack: Stack) -> None:
    run = f"calc-{uuid.uuid4().hex[:8]}"
    tasks = [
        {"id": "c0", "question": "What is 1234 * 56?", "answer": "69104"},
        {"id": "c1", "question": "What is 1000 - 1234?", "answer": "-234"},
    ]
    specs = [spec(run, task["id"], task, agent_class=CALC_AGENT) for task in tasks]
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, specs)
        for task, rollout_spec in zip(tasks, specs, strict=True):
            entry = entries[rollout_spec.rollout_id]
            assert entry.rollout.status.state == SUCCEEDED, entry.rollout.status.error_message
            assert _rewards(entry) == [1.0]
            first, second = await _assert_tokens_are_the_engines(client, entry)
            (tool_call,) = first["response"]["choices"][0]["message"]["tool_calls"]
            assert tool_call["function"]["name"] == "calculator"
            assert first["request"]["tools"][0]["function"]["name"] == "calculator"
            tool_message = second["request"]["messages"][-1]
            assert tool_message == {"role": "tool", "tool_call_id": tool_call["id"], "content": task["answer"]}
            assert second["response"]["choices"][0]["message"]["content"] == f"The answer is {task['answer']}."
        await client.delete_rollouts(list(entries))


async def test_failing_agent_fails_its_rollout_and_keeps_its_calls(stack: Stack) -> None:
    run = f"crash-{uuid.uuid4().hex[:8]}"
    specs = [spec(run, "crash", {"question": "x"}, agent_class="tests.e2e.agents:CrashingAgent", env_map={})]
    async with stack.client() as client:
        entry = (await run_to_end(stack, client, run, specs))[specs[0].rollout_id]
        assert entry.rollout.status.state == FAILED
        assert "exit" in entry.rollout.status.error_message.lower()
        assert "1" in entry.rollout.status.error_message
        assert len(_calls(entry)) == 1 and _rewards(entry) == []
        await _assert_tokens_are_the_engines(client, entry)
        await client.delete_rollouts([specs[0].rollout_id])


async def test_rollout_past_its_timeout_is_killed_and_failed(stack: Stack, tmp_path: Path) -> None:
    run = f"slow-{uuid.uuid4().hex[:8]}"
    pid_file = tmp_path / "agent.pid"
    specs = [
        spec(
            run,
            "slow",
            {"pid_file": str(pid_file)},
            agent_class="tests.e2e.agents:SleepyAgent",
            env_map={"AGL_TASK_PIDFILE": "input.pid_file"},
            timeout_s=3.0,
        )
    ]
    async with stack.client() as client:
        entry = (await run_to_end(stack, client, run, specs))[specs[0].rollout_id]
        assert entry.rollout.status.state == FAILED
        assert "timeout" in entry.rollout.status.error_message.lower() or "timed out" in (
            entry.rollout.status.error_message.lower()
        )
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the timed-out agent process is still running"
        await client.delete_rollouts([specs[0].rollout_id])


async def test_unloadable_agent_class_fails_with_the_reason(stack: Stack) -> None:
    run = f"bad-{uuid.uuid4().hex[:8]}"
    specs = [
        spec(run, "missing", {"question": "q", "answer": "1"}, agent_class="examples.no_such_agent:Agent"),
        spec(run, "badmap", {"question": "q"}, agent_class=MATH_AGENT),  # env_map names input.answer: absent
    ]
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, specs)
        for entry in entries.values():
            assert entry.rollout.status.state == FAILED
            assert entry.rollout.status.error_message
            assert _calls(entry) == []
        assert "answer" in entries[specs[1].rollout_id].rollout.status.error_message
        await client.delete_rollouts(list(entries))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
