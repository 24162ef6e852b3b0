"""The example agents on the Anthropic Messages API (official `anthropic` SDK) and the OpenAI Responses API
(`client.responses.create`), run as a user runs them: by `tools/demo.py --quick --agent-class ...` against the
stand-in engine, and by the controller of the end-to-end stack, whose ledger then shows each call recorded with
the API the agent spoke, the engine's token ids and the tool call that went through."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.standin import model as standin_model
from services.standin.tokenizer import ToyTokenizer, token_logprob
from tests.e2e.conftest import Stack, run_to_end, spec
from tests.e2e.test_demo import REPO_ROOT
from tests.support.procs import processes_mentioning

AGENTS = [
    pytest.param("examples.anthropic_agent.agent:AnthropicMathAgent", "anthropic.messages", id="anthropic"),
    pytest.param("examples.responses_agent.agent:ResponsesMathAgent", "openai.responses", id="responses"),
]
# The calculator as the proxy hands it to the engine (chat tools), whichever API the agent declared it in.
_CHAT_CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
_EXPRESSION = re.compile(r"(-?\d+) ([-+*/]) (-?\d+)")


def _expected_responses(question: str, answer: str) -> tuple[list[int], list[int]]:
    """The stand-in's response tokens for the two turns: its calculator call, then "The answer is N."."""
    tokenizer = ToyTokenizer()
    call = standin_model.chat_reply([{"role": "user", "content": question}], [_CHAT_CALCULATOR], "auto")
    assert call.tool_calls, "the stand-in no longer calls a calculator tool for this question"
    return tokenizer.encode(call.raw), tokenizer.encode(f"The answer is {answer}.")


@pytest.mark.parametrize(("agent_class", "api"), AGENTS)
def test_demo_quick_runs_the_agent_with_its_tool_call(tmp_path: Path, agent_class: str, api: str) -> None:
    data_dir, output_dir = tmp_path / "data", tmp_path / "out"
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_") and key != "ENGINE_URL"}
    argv = [sys.executable, "tools/demo.py", "--quick", "--samples", "2", "--group-size", "2", "--quiet"]
    argv += ["--agent-class", agent_class, "--data-dir", str(data_dir), "--output-dir", str(output_dir)]
    argv += ["--deadline", "120"]
    result = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rollouts: succeeded 4" in result.stdout
    assert "model calls captured: 8" in result.stdout

    (jsonl,) = output_dir.glob("demo-*.jsonl")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 4
    for record in records:
        assert record["state"] == "succeeded", record["error"]
        # The answer comes from the calculator, which the toy model's mistakes do not reach: always right.
        assert record["reward"] == 1.0
        tool_turn, answer_turn = record["calls"]
        call_tokens, answer_tokens = _expected_responses(record["input"]["question"], record["input"]["answer"])
        assert tool_turn["response_token_ids"] == call_tokens
        assert answer_turn["response_token_ids"] == answer_tokens
        for call in (tool_turn, answer_turn):
            assert call["prompt_token_ids"]
            assert len(call["response_logprobs"]) == len(call["response_token_ids"])
        # The second turn's prompt holds the first turn and the tool's result.
        assert len(answer_turn["prompt_token_ids"]) > len(tool_turn["prompt_token_ids"])
    assert processes_mentioning(str(data_dir)) == [], "the demo left processes running"


@pytest.mark.parametrize(("agent_class", "api"), AGENTS)
async def test_recorded_calls_say_the_agents_api_and_carry_the_engines_tokens(
    stack: Stack, agent_class: str, api: str
) -> None:
    run = f"api-{uuid.uuid4().hex[:8]}"
    tasks = [
        {"id": "a0", "question": "What is 1234 * 56?", "answer": "69104"},
        {"id": "a1", "question": "What is 1000 - 1234?", "answer": "-234"},
    ]
    specs = [spec(run, task["id"], task, agent_class=agent_class) for task in tasks]
    tokenizer = ToyTokenizer()
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, specs)
        for task, rollout_spec in zip(tasks, specs, strict=True):
            entry = entries[rollout_spec.rollout_id]
            assert entry.rollout.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, entry.rollout.status
            assert [e.reward.value for e in entry.events if e.event_type == "reward"] == [1.0]
            triplets = [e.model_request for e in entry.events if e.event_type == "model_request"]
            full = [
                e.model_request for e in await client.list_events(rollout_spec.rollout_id, event_type="model_request")
            ]
            assert len(full) == len(triplets) == 2
            exchanges: list[dict[str, Any]] = []
            for recorded, triplet in zip(full, triplets, strict=True):
                assert recorded.api == api
                assert not recorded.stream
                # request_json / response_json are the chat exchange with the engine the token ids belong to.
                request, response = json.loads(recorded.request_json), json.loads(recorded.response_json)
                messages, tools = request["messages"], request.get("tools")
                prompt = tokenizer.encode(standin_model.render_chat(messages, tools))
                output = tokenizer.encode(standin_model.chat_reply(messages, tools, "auto").raw)
                assert list(recorded.prompt_token_ids) == list(triplet.prompt_token_ids) == prompt
                assert list(recorded.response_token_ids) == list(triplet.response_token_ids) == output
                assert response["choices"][0]["token_ids"] == output
                logprobs = [token_logprob(token, position) for position, token in enumerate(output)]
                assert triplet.has_response_logprobs and list(triplet.response_logprobs) == logprobs
                exchanges.append({"request": request, "response": response})
            first, second = exchanges
            assert first["request"]["messages"][-1] == {"role": "user", "content": task["question"]}
            assert first["request"]["tools"][0]["function"]["name"] == "calculator"
            (tool_call,) = first["response"]["choices"][0]["message"]["tool_calls"]
            assert json.loads(tool_call["function"]["arguments"]) == {
                "expression": " ".join(_EXPRESSION.search(task["question"]).groups())  # type: ignore[union-attr]
            }
            # The agent ran the tool and sent its result back in its own API's shape; the proxy made it a tool turn.
            tool_message = second["request"]["messages"][-1]
            assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == tool_call["id"]
            assert tool_message["content"] == task["answer"]
            assert second["response"]["choices"][0]["message"]["content"] == f"The answer is {task['answer']}."
        await client.delete_rollouts(list(entries))
