"""Step health from what a step consumed: each failure mode counted by name, with the rollouts that show it.

The traces come from real triplet-view events (the ledger's protobuf messages) through trace_from_events, as the
rollout manager builds them."""

from __future__ import annotations

from collections import Counter

from services._gen.agl.v1 import event_pb2
from services.trainer.data import step_health as h
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.aggregation import AggregationLevel
from services.trainer.data.triplets import trace_from_events

OK = event_pb2.MODEL_REQUEST_STATUS_OK


def call(
    prompt: list[int], response: list[int], *, finish: str = "stop", tools=None, status=OK, http_status: int = 0
) -> event_pb2.Event:
    request = event_pb2.ModelRequest(
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        has_response_logprobs=True,
        status=status,
        finish_reason=finish,
        http_status=http_status,
    )
    if tools is not None:
        request.tool_calls.CopyFrom(tools)
    return event_pb2.Event(event_type="model_request", model_request=request)


def reward(value: float) -> event_pb2.Event:
    return event_pb2.Event(event_type="reward", reward=event_pb2.Reward(value=value))


def build(rid: str, group: str, events, *, ok: bool = True, reason: str = "", counts=None):
    return trace_from_events(
        rid, group, group, events, reward_fillna_value=0.0, counts=counts if counts is not None else Counter(),
        succeeded=ok, failure_reason=reason, error_message="" if ok else f"{rid} failed",
    )  # fmt: skip


def test_each_failure_mode_is_counted_by_name_with_its_rollouts() -> None:
    unparsed = event_pb2.ToolCallStats(offered_tools=1, parsed_calls=0, unparsed_calls=1)
    good_tool = event_pb2.ToolCallStats(offered_tools=1, parsed_calls=1)
    unknown = event_pb2.ToolCallStats(offered_tools=1, parsed_calls=1, unknown_tool_calls=1)
    failed = event_pb2.MODEL_REQUEST_STATUS_ERROR
    traces = [
        build("ok", "g0", [call([1], [2]), reward(1.0)]),
        build("no-call", "g0", [reward(1.0)]),  # posts a reward without asking the model
        build("early", "g0", [call([1], [2]), reward(0.0), call([1, 2, 5], [6])]),  # reward before its last call
        build("no-reward", "g0", [call([1], [2])]),
        build("tools", "g1", [call([1], [2], tools=unparsed), call([1, 2, 3], [4], tools=good_tool), reward(0.5)]),
        build("unknown", "g1", [call([1], [2], tools=unknown, finish="length"), reward(0.0)]),
        build("err-call", "g1", [call([1], [], status=failed), call([1], [2]), reward(0.0)]),
        # The engine restarting under it (the proxy held every engine back: 503), then its answer.
        build("restart", "g1", [call([1], [], status=failed, http_status=503), call([1], [2]), reward(0.0)]),
        build("killed", "g1", [call([1], [2])], ok=False, reason="KILLED"),
        build("exit", "g1", [], ok=False, reason="EXIT_CODE"),
        # Its engine away for longer than the agent waits: every call answered 503, then the agent gave up.
        build("engine-away", "g2", [call([1], [], status=failed, http_status=503)], ok=False, reason="EXIT_CODE"),
    ]
    health = h.trace_health(traces, ["KILLED", "LOST", "ENGINE_FAILED"])
    assert sorted(health.shares) == sorted(h.TRACE_NAMES)
    # Of the 9 rollouts that did not fail for the infrastructure (killed and engine-away did): engine-away made no
    # successful call either, but that says nothing about its agent (a bench's long engine restart stopped a run
    # on this metric at 0.95).
    assert health.rollouts(h.ROLLOUTS_WITHOUT_CALLS) == ["no-call", "exit"]
    assert health.value(h.ROLLOUTS_WITHOUT_CALLS) == 2 / 9
    assert traces[-1].failure_reason == "ENGINE_FAILED"
    # Eight succeeded, one without a reward.
    assert health.rollouts(h.SUCCEEDED_WITHOUT_REWARD) == ["no-reward"]
    assert health.value(h.SUCCEEDED_WITHOUT_REWARD) == 1 / 8
    # Rewards: ok, no-call, early, tools, unknown, err-call, restart (7); early's came before its last call.
    assert health.rollouts(h.REWARD_BEFORE_LAST_CALL) == ["early"]
    assert health.value(h.REWARD_BEFORE_LAST_CALL) == 1 / 7
    # Calls: 1 + 0 + 2 + 1 + 2 + 1 + 2 + 2 + 1 + 1 = 13: one failed for the request, two for want of an engine.
    assert health.rollouts(h.FAILED_CALLS) == ["err-call"] and health.value(h.FAILED_CALLS) == 1 / 13
    assert health.rollouts(h.ENGINE_UNAVAILABLE_CALLS) == ["restart", "engine-away"]
    assert health.value(h.ENGINE_UNAVAILABLE_CALLS) == 2 / 13
    assert health.rollouts(h.TRUNCATED_CALLS) == ["unknown"] and health.value(h.TRUNCATED_CALLS) == 1 / 10
    # Tool calls written: 1 unparsed + 1 parsed + 1 parsed naming an unknown tool = 3, of which 2 bad.
    assert health.rollouts(h.BAD_TOOL_CALLS) == ["tools", "unknown"] and health.value(h.BAD_TOOL_CALLS) == 2 / 3
    assert health.rollouts(h.FAILED_ROLLOUTS) == ["killed", "exit", "engine-away"]
    assert health.rollouts(h.INFRA_FAILED_ROLLOUTS) == ["killed", "engine-away"]
    assert health.value(h.INFRA_FAILED_ROLLOUTS) == 2 / 11
    metrics = health.metrics()
    assert metrics["agl/health/rollouts_without_calls"] == 2 / 9
    assert set(health.metrics(h.VAL_PREFIX)) == {f"val/agl/health/{name}" for name in h.TRACE_NAMES}


def test_a_clean_step_has_every_metric_at_zero() -> None:
    traces = [build(f"r{i}", "g", [call([1], [2]), reward(float(i))]) for i in range(4)]
    health = h.trace_health(traces, ["KILLED"])
    health.update(h.group_health(traces, identical_steps_before=7))
    assert {name: health.value(name) for name in (*h.TRACE_NAMES, *h.GROUP_NAMES)} == dict.fromkeys(
        (*h.TRACE_NAMES, *h.GROUP_NAMES), 0.0
    )
    assert all(not health.rollouts(name) for name in h.TRACE_NAMES)
    assert h.trace_health([], []).value(h.ROLLOUTS_WITHOUT_CALLS) == 0.0


def test_groups_without_signal_and_the_identical_reward_streak() -> None:
    traces = [
        build("a0", "a", [call([1], [2]), reward(1.0)]),
        build("a1", "a", [call([1], [2]), reward(1.0)]),
        build("b0", "b", [call([1], [2]), reward(0.0)]),
        build("b1", "b", [call([1], [2]), reward(1.0)]),
    ]
    health = h.group_health(traces, identical_steps_before=2)
    assert health.value(h.NO_SIGNAL_GROUPS) == 0.5 and health.rollouts(h.NO_SIGNAL_GROUPS) == ["a0", "a1"]
    assert health.value(h.IDENTICAL_REWARD_STEPS) == 0.0  # the streak ends
    same = [build(f"s{i}", f"g{i // 2}", [call([1], [2]), reward(0.0)]) for i in range(4)]
    streak = h.group_health(same, identical_steps_before=2)
    assert streak.value(h.IDENTICAL_REWARD_STEPS) == 3.0 and streak.value(h.NO_SIGNAL_GROUPS) == 1.0
    assert streak.rollouts(h.IDENTICAL_REWARD_STEPS) == ["s0", "s1", "s2", "s3"]


def test_row_health_names_the_rollouts_that_broke_dropped_or_were_cut() -> None:
    counts: Counter[str] = Counter()
    traces = [
        # Continues its row: merged, context 5 masked.
        build("merged", "g", [call([1], [2]), call([1, 2, 5], [6]), reward(1.0)], counts=counts),
        # The second prompt re-renders the history: a break, a second segment.
        build("broken", "g", [call([1], [2]), call([1, 9, 5], [6]), reward(0.0)], counts=counts),
        # A prompt over the limit: the row is dropped.
        build("long", "g", [call(list(range(1, 12)), [2]), reward(0.0)], counts=counts),
        # A response over the limit: cut.
        build("cut", "g", [call([1], list(range(2, 12))), reward(0.5)], counts=counts),
    ]
    settings = DataPathSettings(level=AggregationLevel.TRAJECTORY, max_prompt_length=8, max_response_length=6)
    health = build_training_batch(traces, settings, counts=counts).health
    assert health is not None and sorted(health.shares) == sorted(h.ROW_NAMES)
    # Continued calls: merged's second (merged) and broken's second (a break).
    assert health.value(h.TRAJECTORY_BREAK_SHARE) == 0.5 and health.rollouts(h.TRAJECTORY_BREAK_SHARE) == ["broken"]
    # Rows built: merged 1, broken 2, long 1 (dropped), cut 1.
    assert health.value(h.DROPPED_ROWS) == 1 / 5 and health.rollouts(h.DROPPED_ROWS) == ["long"]
    assert health.value(h.TRUNCATED_ROWS) == 1 / 4 and health.rollouts(h.TRUNCATED_ROWS) == ["cut"]
    # Response tokens: merged 2 + 1 context, broken 1 + 1, cut 6: context 1 of 11.
    assert health.value(h.MASKED_TOKENS) == 1 / 11
