"""Tool-calling agents on the embedded engine: the unmodified calc agent through the controller, the proxy and the
real CPU vLLM (hermes tool-call parser), its calls parsed, the tool's results fed back, every call recorded with the
engine's token ids and the proxy's tool-call counts; the next prompt continues the previous prompt + response
token for token (the template re-renders the model's own call exactly). A call cut off inside its JSON is counted
as unparsed, not a crash.

The engine is the session's `calc_engine`: a tiny model warm-started on calculator transcripts (most of them with
a tool call), served with vLLM's hermes tool-call parser.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from examples.calc_agent.tasks import TOOLS, make_tasks, messages
from services._gen.agl.v1 import event_pb2, rollout_pb2
from tests.support.engine import CALC_TASKS_SEED, Engine, calc_tasks_solved_with_the_tool
from tests.trainer import cpu_stack

# The first test also starts the session's calc engine (warm start ~30 s, engine start ~40 s on 2 idle cores).
pytestmark = pytest.mark.timeout(600)

CALC_AGENT = "examples.calc_agent.agent:CalcAgent"
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
TASKS = make_tasks(12, seed=CALC_TASKS_SEED)


@pytest.fixture(scope="module")
def calc_stack(calc_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cpu_stack.Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("tool-calls"), calc_engine) as stack:
        yield stack


async def _run_rollouts(stack: cpu_stack.Stack, agent_class: str, tasks: list[dict[str, Any]]) -> list[Any]:
    run = f"tools-{uuid.uuid4().hex[:8]}"
    specs = [
        rollout_pb2.RolloutSpec(
            rollout_id=f"{run}-{i}",
            input_json=json.dumps(task),
            is_train=True,
            config=rollout_pb2.RolloutConfig(
                timeout_seconds=120,
                local=rollout_pb2.LocalLaunchConfig(agent_class=agent_class, env_map=TASK_ENV),
            ),
            metadata=rollout_pb2.RolloutMetadata(labels={"run": run}),
        )
        for i, task in enumerate(tasks)
    ]
    async with stack.client() as client:
        await client.create_rollouts(specs)
        entries = []
        async for entry in client.watch_terminal(labels={"run": run}, include_events=True):
            entries.append(entry)
            if len(entries) == len(specs):
                break
        full = {e.rollout.rollout_id: await client.list_events(e.rollout.rollout_id, attempt_id="*") for e in entries}
    return [(entry, full[entry.rollout.rollout_id]) for entry in entries]


# The calc agent (chat completions) and the same calculator loop on the Anthropic Messages and OpenAI Responses APIs,
# which the proxy translates to chat completions for the engine.
AGENTS = [
    CALC_AGENT,
    "examples.anthropic_agent.agent:AnthropicMathAgent",
    "examples.responses_agent.agent:ResponsesMathAgent",
]


@pytest.mark.parametrize("agent_class", AGENTS)
def test_tool_calls_are_parsed_fed_back_and_the_next_turn_continues_token_for_token(
    calc_stack: cpu_stack.Stack, calc_engine: Engine, agent_class: str
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(calc_engine.model_dir)
    results = asyncio.run(asyncio.wait_for(_run_rollouts(calc_stack, agent_class, TASKS[:8]), 240))
    exact = 0
    for entry, events in results:
        assert entry.rollout.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, entry.rollout.status.error_message
        calls = [e.model_request for e in events if e.event_type == "model_request"]
        assert calls, "every rollout made a model call"
        for request in calls:
            assert request.status == event_pb2.MODEL_REQUEST_STATUS_OK
            assert request.prompt_token_ids and request.response_token_ids
            assert len(request.response_logprobs) == len(request.response_token_ids)
            assert request.tool_calls.offered_tools == 1  # the agent offers its calculator on every call
            assert request.tool_calls.unknown_tool_calls == request.tool_calls.invalid_argument_calls == 0
        # The triplet view the trainer reads carries the same counts.
        triplets = [e.model_request for e in entry.events if e.event_type == "model_request"]
        assert [t.tool_calls for t in triplets] == [c.tool_calls for c in calls]
        for first, second in itertools.pairwise(calls):
            body = json.loads(first.response_json)
            (tool_call,) = body["choices"][0]["message"]["tool_calls"]
            assert tool_call["function"]["name"] == "calculator"
            assert first.tool_calls.parsed_calls == 1
            # The turn stopped at the call's closing marker (the tiny model's second stop token).
            assert tokenizer.decode(first.response_token_ids[-1:]) == "</tool_call>"
            head = list(first.prompt_token_ids) + list(first.response_token_ids)
            head_text, next_text = tokenizer.decode(head), tokenizer.decode(second.prompt_token_ids)
            # The history came back as the model wrote it: the template closed the call's turn, the tool's result
            # followed as a tool message, and nothing else came between.
            sent = json.loads(second.request_json)["messages"]
            assert sent[-1]["role"] == "tool"
            assert next_text == head_text + f"<|im_end|><|im_start|>t:{sent[-1]['content']}<|im_end|><|im_start|>a:"
            # Token for token, also where the model sampled a split of a word other than the tokenizer's own (the
            # proxy's token continuation sends the sampled tokens then).
            assert list(second.prompt_token_ids[: len(head)]) == head
            exact += 1
    # The model calls the tool in ~80% of its sampled first turns: 8 rollouts give at least 2 continued tool-call
    # turns but for a chance far below 1e-4.
    assert exact >= 2, f"{exact} tool-call turns continued"


# An agent that asks with too few tokens for a whole call, sampling (train mode) until the model opens with a call
# (it does ~80% of the time): it exits 0 once the proxy answered 200 with the call's text unparsed (no tool_calls),
# as an agent would see it.
# Samples (seeded, so that a run repeats) until an answer is cut off by max_tokens inside a call it began. A bare
# `<tool_call>` the model closes at once (finish "stop", CI drew one) is a garbled call too, but not the cut-off.
CUT_OFF_AGENT = """
import json, os, sys
import httpx
body = json.loads(sys.argv[1])
for seed in range(24):
    reply = httpx.post(os.environ["AGL_OPENAI_BASE_URL"] + "/chat/completions", json={**body, "seed": seed},
                       headers={"authorization": "Bearer " + os.environ["AGL_KEY"]}, timeout=60)
    print(reply.status_code, reply.text[:2000], file=sys.stderr)
    choice = reply.json()["choices"][0] if reply.status_code == 200 else {"message": {}}
    message = choice["message"]
    began = not message.get("tool_calls") and "<tool_call>" in (message.get("content") or "")
    if began and choice.get("finish_reason") == "length":
        sys.exit(0)
sys.exit(1)
"""


def test_a_call_cut_off_inside_its_json_is_counted_as_unparsed(calc_stack: cpu_stack.Stack) -> None:
    rollout_id = f"cut-{uuid.uuid4().hex[:8]}"
    # A task the model learned to solve with the tool (on one it learned to answer at once, it rarely calls).
    task = calc_tasks_solved_with_the_tool()[0]
    body = {"model": "policy", "messages": messages(task), "tools": TOOLS, "max_tokens": 6}
    command = [sys.executable, "-c", CUT_OFF_AGENT, json.dumps(body)]
    spec = rollout_pb2.RolloutSpec(
        rollout_id=rollout_id,
        input_json="{}",
        is_train=True,
        config=rollout_pb2.RolloutConfig(timeout_seconds=60, local=rollout_pb2.LocalLaunchConfig(command=command)),
    )

    async def run() -> tuple[Any, list[Any]]:
        async with calc_stack.client() as client:
            await client.create_rollouts([spec])
            async for entry in client.watch_terminal(include_events=False):
                if entry.rollout.rollout_id == rollout_id:
                    break
            return entry.rollout, await client.list_events(rollout_id, attempt_id="*", event_type="model_request")

    rollout, events = asyncio.run(asyncio.wait_for(run(), 120))
    assert rollout.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout.status.error_message
    last = events[-1].model_request  # the agent stopped at the first cut-off call
    assert (last.tool_calls.offered_tools, last.tool_calls.parsed_calls, last.tool_calls.unparsed_calls) == (1, 0, 1)
    assert last.finish_reason == "length"
    # Answers that were not calls at all were counted as such: offered a tool, made none, nothing unparsed; only one
    # the model ended itself (a bare `<tool_call>` closed at once) may hold an unparsed call.
    for event in events[:-1]:
        request = event.model_request
        assert request.tool_calls.unparsed_calls == 0 or request.finish_reason == "stop", request


# An agent that samples freely (train mode) on tasks the calc model never saw and feeds every answer back as it came:
# parsed calls as tool calls with the product as the result, anything else (a garbled call included) as text with a
# nudge. Garbled calls often end on the `</tool_call>` stop token, which the answer's text leaves out, and sampled
# splits of numbers are not the tokenizer's own: both re-render to other tokens than the model produced.
FREE_AGENT = """
import json, os, sys
import httpx
messages, tools, seed = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
url, auth = os.environ["AGL_OPENAI_BASE_URL"], {"authorization": "Bearer " + os.environ["AGL_KEY"]}
for turn in range(3):
    body = {"model": "policy", "messages": messages, "tools": tools, "max_tokens": 48, "stream": turn == 1,
            "seed": seed * 3 + turn}
    reply = httpx.post(url + "/chat/completions", json=body, headers=auth, timeout=60)
    assert reply.status_code == 200, reply.text
    if body["stream"]:
        content, calls = "", {}
        for line in reply.text.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice.get("delta") or {}
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call.get("index", 0), {"id": "", "type": "function",
                                                                   "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.get("id") or slot["id"]
                    slot["function"]["name"] += (call.get("function") or {}).get("name") or ""
                    slot["function"]["arguments"] += (call.get("function") or {}).get("arguments") or ""
        message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values())}
    else:
        message = reply.json()["choices"][0]["message"]
    said = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        said["tool_calls"] = message["tool_calls"]
        messages += [said, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "1234"}]
    else:
        messages += [said, {"role": "user", "content": "Use the calculator."}]
"""


STOP = "</tool_call>"  # the tiny model's second stop token


def _proxy_counter(stack: cpu_stack.Stack, name: str, outcome: str) -> float:
    import httpx

    text = httpx.get(f"{stack.proxy_url}/metrics", headers={"authorization": f"Bearer {cpu_stack.KEY}"}).text
    prefix = f'{name}_total{{outcome="{outcome}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_continued_turns_are_sent_as_the_sampled_tokens_and_the_new_context(
    calc_stack: cpu_stack.Stack, calc_engine: Engine
) -> None:
    """Every turn's prompt starts with the previous turn's prompt + response token for token, also where the
    history's text re-renders to other tokens (the proxy splices the sampled tokens in: token continuation), and
    the spliced prompt decodes to the text the template renders for the messages the agent sent (plus a stop token
    the answer's text left out)."""
    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(calc_engine.model_dir)
    spliced_before = _proxy_counter(calc_stack, "agl_proxy_token_continuations", "spliced")
    run = f"free-{uuid.uuid4().hex[:8]}"
    tasks = make_tasks(24, seed=5)
    specs = [
        rollout_pb2.RolloutSpec(
            rollout_id=f"{run}-{i}",
            input_json="{}",
            is_train=True,
            config=rollout_pb2.RolloutConfig(
                timeout_seconds=120,
                local=rollout_pb2.LocalLaunchConfig(
                    command=[sys.executable, "-c", FREE_AGENT, json.dumps(messages(task)), json.dumps(TOOLS), str(i)]
                ),
            ),
            metadata=rollout_pb2.RolloutMetadata(labels={"run": run}),
        )
        for i, task in enumerate(tasks)
    ]

    async def run_all() -> list[tuple[Any, list[Any]]]:
        async with calc_stack.client() as client:
            await client.create_rollouts(specs)
            finished = []
            async for entry in client.watch_terminal(labels={"run": run}, include_events=False):
                finished.append(entry.rollout)
                if len(finished) == len(specs):
                    break
            return [
                (r, await client.list_events(r.rollout_id, attempt_id="*", event_type="model_request"))
                for r in finished
            ]

    results = asyncio.run(asyncio.wait_for(run_all(), 300))
    exact = restored = changed = 0
    for rollout, events in results:
        assert rollout.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout.status.error_message
        calls = [e.model_request for e in events]
        assert len(calls) == 3
        for first, second in itertools.pairwise(calls):
            head = list(first.prompt_token_ids) + list(first.response_token_ids)
            prompt = list(second.prompt_token_ids)
            sent = json.loads(second.request_json)
            sent.pop("stream", None), sent.pop("stream_options", None)
            # The engine's own rendering of what the agent sent (transformers renders garbled call arguments
            # otherwise than vLLM does).
            rendering = httpx.post(f"{calc_engine.openai_url}/chat/completions/render", json=sent, timeout=60)
            rendered = tokenizer.decode(rendering.json()["token_ids"])
            # Stop tokens a turn ended on stay in the prompt although the answer's text (so the history the agent
            # sent back) leaves them out; apart from them the prompt is the text the template renders.
            decoded = tokenizer.decode(prompt)
            assert decoded.replace(STOP, "") == rendered.replace(STOP, ""), (decoded, rendered)
            if prompt[: len(head)] == head:
                exact += 1
                restored += decoded != rendered
            else:
                # Only a history whose text changed breaks: here a garbled call the engine's parser still read as
                # a call, which the agent sent back re-serialised.
                assert not rendered.replace(STOP, "").startswith(tokenizer.decode(head).replace(STOP, ""))
                changed += 1
            # The answer came from the engine: its tokens and log-probs, one each.
            assert len(second.response_logprobs) == len(second.response_token_ids) > 0
    spliced = _proxy_counter(calc_stack, "agl_proxy_token_continuations", "spliced") - spliced_before
    assert exact + changed == 2 * len(tasks) and changed <= len(tasks) // 2, (exact, changed)
    # Sampled at temperature 1 on unseen tasks, about a quarter of the turns re-render to other tokens. Each turn is
    # seeded: unseeded, one CI run drew a sample with none restored (2 spliced, against 7 and 7 in a rerun).
    assert spliced >= 1 and restored >= 1, (spliced, restored)
