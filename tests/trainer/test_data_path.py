"""Events -> triplets -> rows -> DataProto, checked against hand-computed tensors (real verl, CPU torch)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from services._gen.agl.v1 import event_pb2
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.aggregation import rows_from_trace
from services.trainer.data.batch import MISSING_ROLLOUT_LOG_PROBS_KEY
from services.trainer.data.triplets import trace_from_events

from .events import call, reward

pytestmark = pytest.mark.trainer

# A three-call rollout: call 1 continues call 0 (the agent added context [6, 7]); call 2 starts over.
MULTI_TURN = [
    call([1, 2, 3], [4, 5], [-0.1, -0.2]),
    call([1, 2, 3], [9], status=event_pb2.MODEL_REQUEST_STATUS_ERROR),
    call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3]),
    call([5], [], []),
    reward(0.5),
    call([9, 9], [10, 11, 12], [-0.4, -0.5, -0.6]),
    reward(1.0),
]


def trace(rollout_id: str, group: str, events: list[event_pb2.Event], counts: Counter[str], fill: float = 0.0):
    return trace_from_events(rollout_id, group, f"data-{group}", events, reward_fillna_value=fill, counts=counts)


def settings(**kw) -> DataPathSettings:
    base = {"level": "trajectory", "max_prompt_length": 4, "max_response_length": 6}
    base.update(kw)
    return DataPathSettings(**base)


def test_triplets_drop_failed_and_empty_calls_and_keep_last_reward() -> None:
    counts: Counter[str] = Counter()
    t = trace("r1", "g1", MULTI_TURN, counts)
    assert [x.response_ids for x in t.triplets] == [[4, 5], [8], [10, 11, 12]]
    assert [x.turn_index for x in t.triplets] == [0, 1, 2]
    assert t.reward == 1.0 and not t.reward_missing
    assert counts == Counter({"dropped_error_calls": 1, "dropped_empty_responses": 1})


def test_missing_reward_takes_fill_value_and_is_counted() -> None:
    counts: Counter[str] = Counter()
    t = trace("r1", "g1", [call([1], [2], [-1.0])], counts, fill=-0.25)
    assert t.reward == -0.25 and t.reward_missing
    assert counts["reward_missing"] == 1


def test_trajectory_merges_continuations_and_breaks_on_mismatch() -> None:
    counts: Counter[str] = Counter()
    rows = rows_from_trace(
        trace("r1", "g1", MULTI_TURN, counts), "trajectory", max_prompt_length=8, max_response_length=8, counts=counts
    )
    assert len(rows) == 2
    first, second = rows
    assert first.prompt_ids == [1, 2, 3]
    assert first.response_ids == [4, 5, 6, 7, 8]
    assert first.response_mask == [1, 1, 0, 0, 1]
    assert first.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (first.turn_index, first.num_turns) == (0, 2)
    assert second.prompt_ids == [9, 9] and second.response_mask == [1, 1, 1]
    assert (second.turn_index, second.num_turns) == (2, 1)
    assert counts["trajectory_breaks"] == 1 and counts["merged_calls"] == 1


def test_transition_gives_one_row_per_call() -> None:
    counts: Counter[str] = Counter()
    rows = rows_from_trace(
        trace("r1", "g1", MULTI_TURN, counts), "transition", max_prompt_length=8, max_response_length=8, counts=counts
    )
    assert [r.prompt_ids for r in rows] == [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [9, 9]]
    assert [r.response_mask for r in rows] == [[1, 1], [1], [1, 1, 1]]
    assert [r.turn_index for r in rows] == [0, 1, 2]
    assert counts["trajectory_breaks"] == 0


def test_trajectory_tensors_match_hand_computation() -> None:
    counts: Counter[str] = Counter()
    traces = [
        trace("r1", "g1", MULTI_TURN, counts),
        trace("r2", "g1", [call([1, 2], [4], [-0.7]), reward(0.0)], counts),
    ]
    out = build_training_batch(traces, settings(), counts=counts)
    b = out.data.batch
    assert b["prompts"].tolist() == [[0, 1, 2, 3], [0, 0, 9, 9], [0, 0, 1, 2]]
    assert b["responses"].tolist() == [[4, 5, 6, 7, 8, 0], [10, 11, 12, 0, 0, 0], [4, 0, 0, 0, 0, 0]]
    assert b["input_ids"].tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 0],
        [0, 0, 9, 9, 10, 11, 12, 0, 0, 0],
        [0, 0, 1, 2, 4, 0, 0, 0, 0, 0],
    ]
    assert b["attention_mask"].tolist() == [
        [0, 1, 1, 1, 1, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0, 0, 0, 0],
    ]
    assert b["position_ids"].tolist() == [
        [0, 0, 1, 2, 3, 4, 5, 6, 7, 7],
        [0, 0, 0, 1, 2, 3, 4, 4, 4, 4],
        [0, 0, 0, 1, 2, 2, 2, 2, 2, 2],
    ]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert b["token_level_scores"].tolist() == [
        [0, 0, 0, 0, 1.0, 0],
        [0, 0, 1.0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    expected_lp = torch.tensor(
        [[-0.1, -0.2, 0, 0, -0.3, 0], [-0.4, -0.5, -0.6, 0, 0, 0], [-0.7, 0, 0, 0, 0, 0]], dtype=torch.float32
    )
    assert torch.equal(b["rollout_log_probs"], expected_lp)
    nt = out.data.non_tensor_batch
    assert nt["uid"].tolist() == ["g1", "g1", "g1"]
    assert nt["data_id"].tolist() == ["data-g1"] * 3
    assert nt["rollout_id"].tolist() == ["r1", "r1", "r2"]
    assert nt["turn_index"].tolist() == [0, 2, 0]


def test_transition_tensors_match_hand_computation() -> None:
    counts: Counter[str] = Counter()
    events = [call([1, 2], [3, 4], [-1.0, -2.0]), call([1, 2, 3, 4, 5], [6], [-3.0]), reward(2.0)]
    out = build_training_batch([trace("r1", "g1", events, counts)], settings(level="transition", max_prompt_length=5))
    b = out.data.batch
    assert b["prompts"].tolist() == [[0, 0, 0, 1, 2], [1, 2, 3, 4, 5]]
    assert b["responses"].tolist() == [[3, 4, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert b["token_level_scores"].tolist() == [[0, 2.0, 0, 0, 0, 0], [2.0, 0, 0, 0, 0, 0]]
    assert b["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 5]
    assert out.data.non_tensor_batch["turn_index"].tolist() == [0, 1]


def test_long_prompt_dropped_and_long_response_truncated_with_masks_and_logprobs() -> None:
    counts: Counter[str] = Counter()
    events = [
        call([1, 2], [3, 4, 5], [-1.0, -2.0, -3.0]),
        call([1, 2, 3, 4, 5, 6, 7], [8, 9], [-4.0, -5.0]),
        call([7, 7, 7, 7, 7], [1], [-1.0]),
        reward(1.0),
    ]
    t = trace("r1", "g1", events, counts)
    rows = rows_from_trace(t, "trajectory", max_prompt_length=4, max_response_length=6, counts=counts)
    # Row 0: [3,4,5] + context [6,7] + [8,9] = 7 tokens, cut to 6: [3,4,5,6,7,8].
    assert rows[0].response_ids == [3, 4, 5, 6, 7, 8]
    assert rows[0].response_mask == [1, 1, 1, 0, 0, 1]
    assert rows[0].logprobs == [-1.0, -2.0, -3.0, 0.0, 0.0, -4.0]
    assert len(rows) == 1
    assert counts["truncated_response_rows"] == 1 and counts["dropped_prompt_too_long_rows"] == 1

    counts = Counter()
    cut = rows_from_trace(t, "trajectory", max_prompt_length=4, max_response_length=5, counts=counts)
    # Cut to 5 ends inside the context [6, 7]: the trailing context goes too.
    assert cut[0].response_ids == [3, 4, 5] and cut[0].response_mask == [1, 1, 1]
    assert cut[0].logprobs == [-1.0, -2.0, -3.0]

    out = build_training_batch([t], settings(max_prompt_length=4, max_response_length=6))
    assert out.data.batch["token_level_scores"].tolist() == [[0, 0, 0, 0, 0, 1.0]]
    assert out.metrics["agl/data/dropped_prompt_too_long_rows"] == 1.0
    assert out.metrics["agl/data/truncated_response_rows"] == 1.0


def test_rollout_log_probs_kept_when_some_rows_lack_them_and_those_rows_flagged() -> None:
    counts: Counter[str] = Counter()
    traces = [
        trace("r1", "g1", [call([1], [2], [-0.5]), reward(1.0)], counts),
        trace("r2", "g1", [call([1], [3]), reward(0.0)], counts),
    ]
    out = build_training_batch(traces, settings())
    by_rollout = dict(zip(out.data.non_tensor_batch["rollout_id"].tolist(), range(2), strict=True))
    lp = out.data.batch["rollout_log_probs"]
    assert lp[by_rollout["r1"]].tolist() == [-0.5, 0, 0, 0, 0, 0] and lp[by_rollout["r2"]].tolist() == [0.0] * 6
    missing = out.data.batch[MISSING_ROLLOUT_LOG_PROBS_KEY]
    assert missing[by_rollout["r2"]].item() and not missing[by_rollout["r1"]].item()
    assert out.metrics["agl/data/has_rollout_log_probs"] == 1.0
    assert counts["logprobs_missing_calls"] == 1
    # No row with log-probs: no rollout_log_probs at all.
    out = build_training_batch(traces[1:], settings())
    assert "rollout_log_probs" not in out.data.batch
    assert out.metrics["agl/data/has_rollout_log_probs"] == 0.0
    # A merged row whose later call lacks log-probs loses them as a whole.
    merged = trace("r3", "g2", [call([1], [2], [-0.5]), call([1, 2], [3]), reward(1.0)], counts)
    rows = rows_from_trace(merged, "trajectory", max_prompt_length=4, max_response_length=6, counts=counts)
    assert rows[0].response_ids == [2, 3] and rows[0].logprobs is None
    # A log-prob count that does not match the response is treated as missing.
    bad = trace("r4", "g2", [call([1], [2, 3], [-0.5]), reward(1.0)], counts)
    assert bad.triplets[0].logprobs is None


def test_no_rows_gives_no_batch() -> None:
    counts: Counter[str] = Counter()
    out = build_training_batch([trace("r1", "g1", [reward(1.0)], counts)], settings())
    assert out.data is None and out.num_updates == 0
    assert out.metrics["agl/data/rows_built"] == 0.0


def _rows(events: list[event_pb2.Event], counts: Counter[str]):
    t = trace("r1", "g1", events, counts)
    return rows_from_trace(t, "trajectory", max_prompt_length=64, max_response_length=64, counts=counts)


def test_interleaved_conversations_stay_one_row_each() -> None:
    # A main conversation (prompt [1, 2]) and a sub-agent's (prompt [1, 5], the same system token), their calls
    # alternating as a harness's sub-agent's land between its main conversation's; each call appends to its own.
    events = [
        call([1, 2], [3], [-0.1]),
        call([1, 5], [6], [-0.2]),
        call([1, 2, 3, 7], [8], [-0.3]),
        call([1, 5, 6, 9], [10], [-0.4]),
        call([1, 2, 3, 7, 8, 11], [12], [-0.5]),
        reward(1.0),
    ]
    counts: Counter[str] = Counter()
    main, sub = _rows(events, counts)
    assert (main.prompt_ids, main.response_ids, main.response_mask) == ([1, 2], [3, 7, 8, 11, 12], [1, 0, 1, 0, 1])
    assert main.logprobs == [-0.1, 0.0, -0.3, 0.0, -0.5]
    assert (main.turn_index, main.num_turns) == (0, 3)
    assert (sub.prompt_ids, sub.response_ids, sub.response_mask) == ([1, 5], [6, 9, 10], [1, 0, 1])
    assert sub.logprobs == [-0.2, 0.0, -0.4]
    assert (sub.turn_index, sub.num_turns) == (1, 2)
    # The sub-agent's opening call continues no row: the one break, its segment. Every other call merged.
    assert counts["trajectory_breaks"] == 1 and counts["merged_calls"] == 3


def test_a_call_continues_an_older_row_after_another_conversation_and_a_changed_history_still_breaks() -> None:
    events = [
        call([1, 2], [3], [-0.1]),
        call([8], [9], [-0.2]),  # another conversation
        call([1, 2, 3, 4], [5], [-0.3]),  # back to the first: continues row 0, not the last row
        call([1, 2, 4, 4], [6], [-0.4]),  # the first conversation with its answer edited (3 -> 4): a real break
        reward(0.5),
    ]
    counts: Counter[str] = Counter()
    rows = _rows(events, counts)
    assert [(r.prompt_ids, r.response_ids, r.response_mask) for r in rows] == [
        ([1, 2], [3, 4, 5], [1, 0, 1]),
        ([8], [9], [1]),
        ([1, 2, 4, 4], [6], [1]),
    ]
    assert [r.turn_index for r in rows] == [0, 1, 3]
    assert counts["trajectory_breaks"] == 2 and counts["merged_calls"] == 1
    metrics = build_training_batch([trace("r1", "g1", events, Counter())], settings(max_prompt_length=8)).metrics
    assert metrics["agl/data/trajectory_breaks"] == 2.0 and metrics["agl/data/segments_per_rollout"] == 3.0


def test_of_several_rows_a_call_continues_it_goes_to_the_longest_then_the_last_extended() -> None:
    # Row 0 holds [1, 2, 3, 4]; row 1 (a shorter prompt, so not a continuation of row 0) holds [1, 2, 3], a prefix
    # of it. A prompt that continues both goes to row 0: its tokens are all in row 0 already, the least context.
    counts: Counter[str] = Counter()
    rows = _rows(
        [call([1], [2, 3, 4], [-0.1] * 3), call([1, 2], [3], [-0.2]), call([1, 2, 3, 4, 5], [6], [-0.3])], counts
    )
    assert [(r.prompt_ids, r.response_ids, r.response_mask) for r in rows] == [
        ([1], [2, 3, 4, 5, 6], [1, 1, 1, 0, 1]),
        ([1, 2], [3], [1]),
    ]
    # Two equal rows (the same call sampled twice alike): the next call goes to the one a call went to last.
    counts = Counter()
    rows = _rows([call([1], [2], [-0.1]), call([1], [2], [-0.2]), call([1, 2, 3], [4], [-0.3])], counts)
    assert [(r.response_ids, r.logprobs) for r in rows] == [([2], [-0.1]), ([2, 3, 4], [-0.2, 0.0, -0.3])]
    assert counts["trajectory_breaks"] == 1 and counts["merged_calls"] == 1


# A trajectory sampled across a push: call 0 by weights v1, its continuation by v3; another rollout of the group
# wholly by v1, and a third by v3.
SPANNING = [call([1, 2], [3, 4], [-0.1, -0.2], model_version=1), call([1, 2, 3, 4, 5], [6], [-0.3], model_version=3)]


def _spanning_group(counts: Counter[str]):
    return [
        trace("r-span", "g", [*SPANNING, reward(1.0)], counts),
        trace("r-old", "g", [call([1, 2], [7, 8], [-0.5, -0.5], model_version=1), reward(0.0)], counts),
        trace("r-new", "g", [call([1, 2], [9], [-0.5], model_version=3), reward(0.5)], counts),
    ]


def test_each_trained_token_has_the_version_that_sampled_it_and_its_lag_is_measured() -> None:
    counts: Counter[str] = Counter()
    [span, old, new] = _spanning_group(counts)
    [row] = rows_from_trace(span, "trajectory", max_prompt_length=8, max_response_length=8, counts=counts)
    assert row.response_ids == [3, 4, 5, 6] and row.response_mask == [1, 1, 0, 1]
    assert row.versions == [1, 1, -1, 3]
    batch = build_training_batch([span, old, new], settings(max_response_length=8), weights_version=4)
    m = batch.metrics
    # Trained tokens and their lags behind v4: r-span 3, 3, 1; r-old 3, 3; r-new 1.
    assert m["agl/async/staleness_mean"] == pytest.approx(14 / 6)
    assert (m["agl/async/staleness_max"], m["agl/async/staleness_p90"]) == (3.0, 3.0)
    assert m["agl/async/stale_token_fraction"] == 1.0
    assert (m["agl/async/stale_tokens_masked"], m["agl/async/stale_rows_dropped"]) == (0.0, 0.0)
    assert batch.data is not None and int(batch.data.batch["response_mask"].sum()) == 6


def test_tokens_beyond_the_staleness_bound_are_masked_and_a_row_left_empty_leaves_its_group() -> None:
    counts: Counter[str] = Counter()
    batch = build_training_batch(
        _spanning_group(counts), settings(max_response_length=8, max_staleness=2), weights_version=4
    )
    m = batch.metrics
    assert (m["agl/async/stale_tokens_masked"], m["agl/async/stale_rows_dropped"]) == (4.0, 1.0)
    assert (m["agl/async/staleness_mean"], m["agl/async/staleness_max"]) == (1.0, 1.0)
    by_rollout = {row.rollout_id: row for row in batch.rows}
    assert sorted(by_rollout) == ["r-new", "r-span"]  # r-old's only row was wholly too old
    # r-span keeps its v1 tokens as context (the v3 call saw them) and trains the v3 token only.
    assert by_rollout["r-span"].response_ids == [3, 4, 5, 6] and by_rollout["r-span"].response_mask == [0, 0, 0, 1]
    # r-old left the group: its reward 0.0 no longer counts in the baseline of the other two (1.0 and 0.5).
    assert batch.advantages["r-span"] > 0 > batch.advantages["r-new"] and "r-old" not in batch.advantages
    assert batch.data is not None and int(batch.data.batch["response_mask"].sum()) == 2


def test_a_bound_of_zero_trains_only_what_the_updated_weights_sampled() -> None:
    counts: Counter[str] = Counter()
    batch = build_training_batch(
        _spanning_group(counts), settings(max_response_length=8, max_staleness=0), weights_version=3
    )
    assert sorted(row.rollout_id for row in batch.rows) == ["r-new", "r-span"]
    assert batch.metrics["agl/async/stale_token_fraction"] == 0.0
    assert batch.metrics["agl/async/stale_tokens_masked"] == 4.0
