"""Multi-turn rollouts become exact rows: recorded traces (prompts rendered by the tiny model's own chat templates,
as the engine renders them; responses as the engine samples them, EOS included) against hand-computed rows, token
by token. A pure append (the calc agent's tool call, the tool result, the answer) is one row with the tool result
masked; a history that is not an append (past reasoning stripped, a restarted conversation) is several exact
segment rows of the one rollout, each with its own prompt and the rollout's advantage."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import torch

from examples.calc_agent.agent import CALCULATOR_TOOL, SYSTEM_PROMPT
from examples.calc_agent.tasks import tool_call_text
from services._gen.agl.v1 import event_pb2
from services.engine.tiny_model import EOS_TOKEN, REASONING_STRIPPING_CHAT_TEMPLATE, TOOL_CALL_END, build_tokenizer
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.advantage import rollout_advantages
from services.trainer.data.aggregation import TRAJECTORY_BREAKS, rows_from_trace
from services.trainer.data.loss import ROW_WEIGHTS_KEY
from services.trainer.data.trace_stats import row_metrics, trace_metrics
from services.trainer.data.triplets import trace_from_events
from tests.trainer.events import call, reward

QUESTION = "What is 37 * 84?"
TOOLS = [CALCULATOR_TOOL]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer([SYSTEM_PROMPT, QUESTION, tool_call_text("37 * 84"), "tools: calculator(expression)"] * 4)


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = TOOLS) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sampled(tokenizer: Any, text: str) -> list[int]:
    """The tokens an engine samples for `text`, ending with the token it stops on: the EOS, or for a tool call the
    call's closing marker (the tiny model's second stop token), which `text` then ends with."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if text.endswith(TOOL_CALL_END) else [*ids, tokenizer.convert_tokens_to_ids(EOS_TOKEN)]


def logprobs_for(tokens: list[int], base: float) -> list[float]:
    return [base - 0.01 * i for i in range(len(tokens))]


def tool_call_message(arguments: dict[str, Any]) -> dict[str, Any]:
    # As the agent sends it back: vLLM's hermes parser gives arguments as json.dumps text.
    function = {"name": "calculator", "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c0", "type": "function", "function": function}],
    }


def stats(parsed: int, unparsed: int = 0, unknown: int = 0, invalid: int = 0) -> event_pb2.ToolCallStats:
    return event_pb2.ToolCallStats(
        offered_tools=1,
        parsed_calls=parsed,
        unparsed_calls=unparsed,
        unknown_tool_calls=unknown,
        invalid_argument_calls=invalid,
    )


def trace_of(rollout: str, group: str, calls: list[event_pb2.Event], value: float) -> Any:
    return trace_from_events(rollout, group, "d", [*calls, reward(value)], reward_fillna_value=0.0, counts=Counter())


def calc_trace(tokenizer: Any, rollout: str = "r0", value: float = 1.0) -> tuple[Any, dict[str, list[Any]]]:
    """The calc agent's rollout: a calculator call, the tool's result fed back, the answer copied from it."""
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]
    p1 = prompt_ids(tokenizer, opening)
    r1 = sampled(tokenizer, tool_call_text("37 * 84"))
    p2 = prompt_ids(
        tokenizer,
        [
            *opening,
            tool_call_message({"expression": "37 * 84"}),
            {"role": "tool", "tool_call_id": "c0", "content": "3108"},
        ],
    )
    r2 = sampled(tokenizer, "3108")
    lp1, lp2 = logprobs_for(r1, -0.5), logprobs_for(r2, -0.2)
    first, second = call(p1, r1, lp1), call(p2, r2, lp2)
    first.model_request.tool_calls.CopyFrom(stats(parsed=1))
    second.model_request.tool_calls.CopyFrom(stats(parsed=0))
    return trace_of(rollout, "g0", [first, second], value), {"p": [p1, p2], "r": [r1, r2], "lp": [lp1, lp2]}


def test_tool_call_turns_are_one_exact_row_with_the_tool_result_masked(tokenizer: Any) -> None:
    trace, parts = calc_trace(tokenizer)
    (p1, p2), (r1, r2), (lp1, lp2) = parts["p"], parts["r"], parts["lp"]
    # The template renders the call the model made back into exactly the tokens it sampled.
    assert p2[: len(p1) + len(r1)] == p1 + r1
    context = p2[len(p1) + len(r1) :]
    # The call's turn is closed by the template, then the tool's result: context, masked.
    assert tokenizer.decode(context) == "<|im_end|><|im_start|>t:3108<|im_end|><|im_start|>a:"

    counts: Counter[str] = Counter()
    (row,) = rows_from_trace(trace, "trajectory", max_prompt_length=512, max_response_length=512, counts=counts)
    assert row.prompt_ids == p1
    assert row.response_ids == r1 + context + r2
    assert row.response_mask == [1] * len(r1) + [0] * len(context) + [1] * len(r2)
    assert row.logprobs == lp1 + [0.0] * len(context) + lp2
    assert row.num_turns == 2
    assert counts[TRAJECTORY_BREAKS] == 0
    metrics = row_metrics([row], counts)
    assert metrics["agl/data/trajectory_breaks"] == 0.0
    assert metrics["agl/data/segments_per_rollout"] == 1.0
    assert metrics["agl/data/context_tokens_per_row"] == float(len(context))
    assert metrics["agl/data/masked_token_fraction"] == pytest.approx(len(context) / len(row.response_ids))


def test_stripped_reasoning_gives_exact_segment_rows_that_share_the_rollout_advantage() -> None:
    tokenizer = build_tokenizer(chat_template=REASONING_STRIPPING_CHAT_TEMPLATE)
    first_turn = [{"role": "user", "content": "What is 2 + 3?"}]
    p1 = prompt_ids(tokenizer, first_turn, tools=None)
    r1 = sampled(tokenizer, "<think>two and three</think>5")
    history = [*first_turn, {"role": "assistant", "content": "<think>two and three</think>5"}]
    p2 = prompt_ids(tokenizer, [*history, {"role": "user", "content": "And times 4?"}], tools=None)
    r2 = sampled(tokenizer, "<think>five fours</think>20")
    # The template dropped the past turn's reasoning: the second prompt does not continue the first row.
    assert p2[: len(p1) + len(r1)] != p1 + r1
    assert "two and three" not in tokenizer.decode(p2)
    lp1, lp2 = logprobs_for(r1, -0.3), logprobs_for(r2, -0.4)
    stripped = trace_of("r-strip", "g0", [call(p1, r1, lp1), call(p2, r2, lp2)], 1.0)
    other = trace_of("r-other", "g0", [call(p1, r1, lp1)], 0.0)

    counts: Counter[str] = Counter()
    rows = rows_from_trace(stripped, "trajectory", max_prompt_length=512, max_response_length=512, counts=counts)
    assert [(r.prompt_ids, r.response_ids, r.response_mask, r.logprobs) for r in rows] == [
        (p1, r1, [1] * len(r1), lp1),
        (p2, r2, [1] * len(r2), lp2),
    ]
    assert counts[TRAJECTORY_BREAKS] == 1
    assert row_metrics(rows, counts)["agl/data/segments_per_rollout"] == 2.0
    other_rows = rows_from_trace(other, "trajectory", max_prompt_length=512, max_response_length=512, counts=Counter())
    advantages = rollout_advantages([*rows, *other_rows])
    assert advantages["r-strip"] > 0 > advantages["r-other"]

    # In the batch each segment row carries its rollout's advantage, and the loss weights still give every
    # rollout the same total weight, however many rows it became.
    settings = DataPathSettings(max_prompt_length=128, max_response_length=64, pad_token_id=0)
    batch = build_training_batch([stripped, other], settings).data
    assert batch is not None
    ids = list(batch.non_tensor_batch["rollout_id"])
    assert ids == ["r-strip", "r-strip", "r-other"]
    mask = batch.batch["response_mask"]
    weights = batch.batch[ROW_WEIGHTS_KEY] * mask
    for row in range(3):
        row_advantages = batch.batch["advantages"][row][mask[row].bool()]
        assert torch.allclose(row_advantages, torch.full_like(row_advantages, advantages[ids[row]]))
    strip_total = float(weights[0].sum() + weights[1].sum())
    assert strip_total == pytest.approx(float(weights[2].sum()))


def test_a_restarted_history_is_a_new_segment_not_a_retokenized_row(tokenizer: Any) -> None:
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]
    p1 = prompt_ids(tokenizer, opening)
    r1 = sampled(tokenizer, tool_call_text("37 * 84"))
    # A sub-agent (or a compacted context): a fresh conversation in the same rollout.
    p2 = prompt_ids(tokenizer, [{"role": "user", "content": "Summarise: 3108"}], tools=None)
    r2 = sampled(tokenizer, "3108")
    trace = trace_of("r1", "g0", [call(p1, r1, logprobs_for(r1, -1.0)), call(p2, r2, logprobs_for(r2, -1.0))], 1.0)
    counts: Counter[str] = Counter()
    rows = rows_from_trace(trace, "trajectory", max_prompt_length=512, max_response_length=512, counts=counts)
    assert [(r.prompt_ids, r.response_ids) for r in rows] == [(p1, r1), (p2, r2)]
    assert all(set(r.response_mask) == {1} for r in rows)
    assert counts[TRAJECTORY_BREAKS] == 1


def test_trace_metrics_count_turns_tool_calls_and_what_did_not_parse(tokenizer: Any) -> None:
    calc, _ = calc_trace(tokenizer, "r0")
    unparsed_call = call([1, 2], [3, 2], [-0.1, -0.1])
    unparsed_call.model_request.tool_calls.CopyFrom(stats(parsed=0, unparsed=1))
    unparsed_call.model_request.finish_reason = "length"
    wrong_tool = call([1, 2], [5, 2], [-0.1, -0.1])
    wrong_tool.model_request.tool_calls.CopyFrom(stats(parsed=2, unknown=1, invalid=1))
    failed = call([1, 2], [], status=event_pb2.MODEL_REQUEST_STATUS_ERROR)
    traces = [
        calc,
        trace_of("r1", "g0", [unparsed_call], 0.0),
        trace_of("r2", "g0", [wrong_tool, failed], 0.0),
        trace_of("r3", "g0", [], 0.0),
    ]
    metrics = trace_metrics(traces)
    assert metrics["agl/turns/mean"] == (2 + 1 + 1 + 0) / 4
    assert metrics["agl/turns/max"] == 2.0
    assert metrics["agl/tools/call_rate"] == 2 / 4  # r0 and r2 made parsed calls
    assert metrics["agl/tools/calls_per_rollout"] == (1 + 2) / 4
    assert metrics["agl/tools/unparsed_calls"] == 1.0
    assert metrics["agl/tools/unknown_tool_calls"] == 1.0
    assert metrics["agl/tools/invalid_argument_calls"] == 1.0
    assert metrics["agl/calls/truncated"] == 1.0
    assert metrics["agl/calls/failed"] == 1.0
    assert metrics["agl/rollouts/without_calls"] == 1.0
    assert set(trace_metrics(traces, prefix="val/agl")) == {f"val/{key}" for key in metrics}

    # Validation calls carry no token ids (nothing trains on them): they are no triplets, but they count.
    val_call = call([], [])
    val_call.model_request.tool_calls.CopyFrom(stats(parsed=1))
    val = trace_of("v0", "g0", [val_call], 1.0)
    assert val.triplets == []
    val_metrics = trace_metrics([val], prefix="val/agl")
    assert val_metrics["val/agl/tools/call_rate"] == 1.0 and val_metrics["val/agl/turns/mean"] == 1.0
