"""The training-row records: each consumed rollout's rows as the console draws them (masks, both log-probs, segments,
advantage, the health metrics it counts in, why a rollout was left out)."""

from __future__ import annotations

import json
from collections import Counter

from services.console.training import training_records
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.aggregation import AggregationLevel
from services.trainer.data.infra_policy import InfraSettings, select
from services.trainer.data.row_records import EVENT_TYPE, event_chunks, flags_by_rollout, row_events, row_records
from services.trainer.data.triplets import RolloutTrace, Triplet


def test_a_multi_turn_rollout_with_a_break_and_a_killed_sibling() -> None:
    traces = [
        RolloutTrace(
            "r0", "g", "d", 1.0, attempt_id="a1",
            triplets=[
                Triplet([1, 2], [3, 4], [-0.1, -0.2], 0),
                Triplet([1, 2, 3, 4, 9], [5], [-0.3], 1),  # continues: 9 is context
                Triplet([1, 7], [6], [-0.4], 2),  # does not: a second segment
            ],
        ),
        RolloutTrace("r1", "g", "d", 0.0, attempt_id="a1", triplets=[Triplet([1, 2], [8], [-0.5], 0)]),
        RolloutTrace("r2", "g", "d", 0.0, succeeded=False, failure_reason="KILLED", attempt_id="a2"),
    ]  # fmt: skip
    selection = select(traces, InfraSettings(), group_size=3)
    settings = DataPathSettings(level=AggregationLevel.TRAJECTORY, max_prompt_length=16, max_response_length=16)
    prepared = build_training_batch(selection.kept, settings, counts=Counter())
    trained = {("r0", 0), ("r0", 2), ("r1", 0)}
    recomputed = {("r0", 0): [-0.11, 0.0, -0.19, -0.31], ("r1", 0): [-0.52]}
    records = row_records(
        4, traces, {t.rollout_id for t in selection.kept}, selection.left_out, prepared.rows, prepared.advantages,
        trained, recomputed, flags_by_rollout({"trajectory_breaks": ["r0"], "infra_failed_rollouts": ["r2"]}),
        lambda ids: [f"<{i}>" for i in ids],
    )  # fmt: skip
    first = records["r0"]
    assert first["step"] == 4 and first["reward"] == 1.0 and first["kept"] and first["flags"] == ["trajectory_breaks"]
    assert first["advantage"] == round(prepared.advantages["r0"], 6) > 0
    row, segment = first["rows"]
    assert (row["segment"], row["segments"], row["first_turn"], row["turns"], row["break_before"]) == (
        0,
        2,
        0,
        2,
        False,
    )
    assert row["tokens"] == ["<3>", "<4>", "<9>", "<5>"] and row["mask"] == [1, 1, 0, 1]
    assert row["engine_logprobs"] == [-0.1, -0.2, 0.0, -0.3] and row["trainer_logprobs"] == [-0.11, 0.0, -0.19, -0.31]
    assert row["prompt_tokens"] == 2 and row["trained"]
    assert (segment["segment"], segment["break_before"], segment["first_turn"]) == (1, True, 2)
    assert segment["trained"] and segment["trainer_logprobs"] is None  # no recomputation given for it
    assert records["r1"]["rows"][0]["trainer_logprobs"] == [-0.52]
    killed = records["r2"]
    assert not killed["kept"] and killed["rows"] == [] and killed["advantage"] is None
    assert killed["left_out"] == "an infrastructure failure (KILLED), policy drop_rollout"
    assert killed["flags"] == ["infra_failed_rollouts"]

    events = row_events(4, records, {t.rollout_id: t.attempt_id for t in traces})
    assert [(e.rollout_id, e.attempt_id, e.event_id, e.event_type) for e in events] == [
        ("r0", "a1", "agl-rows-s4", EVENT_TYPE),
        ("r1", "a1", "agl-rows-s4", EVENT_TYPE),
        ("r2", "a2", "agl-rows-s4", EVENT_TYPE),
    ]
    assert json.loads(events[0].data_json) == first


def test_large_steps_are_appended_in_chunks() -> None:
    events = row_events(1, {f"r{i}": {"rows": "x" * 90} for i in range(5)}, {})
    size = len(events[0].data_json)
    chunks = event_chunks(events, 2 * size)
    assert [[e.rollout_id for e in c] for c in chunks] == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    assert [len(c) for c in event_chunks(events, size // 2)] == [1, 1, 1, 1, 1]  # one alone may be more
    assert event_chunks([], size) == []


def test_a_row_of_interleaved_conversations_records_its_calls_and_the_console_names_them() -> None:
    # Calls 0 and 2 are one conversation, call 1 another's (a sub-agent's) between them: two rows, calls [0, 2], [1].
    calls = [Triplet([1, 2], [3], [-0.1], 0), Triplet([1, 5], [6], [-0.2], 1), Triplet([1, 2, 3, 4], [7], [-0.3], 2)]
    trace = RolloutTrace("r0", "g", "d", 1.0, attempt_id="a1", triplets=calls)
    settings = DataPathSettings(level=AggregationLevel.TRAJECTORY, max_prompt_length=16, max_response_length=16)
    prepared = build_training_batch([trace], settings, counts=Counter())
    records = row_records(
        1, [trace], {"r0"}, {}, prepared.rows, prepared.advantages, set(), {}, {}, lambda ids: [str(i) for i in ids]
    )
    assert [(r["first_turn"], r["turns"], r["turn_indices"]) for r in records["r0"]["rows"]] == [
        (0, 2, [0, 2]),
        (1, 1, [1]),
    ]
    # The console reads the record back and names the calls 1-based, a list where they are not consecutive.
    (training,) = training_records(row_events(1, records, {"r0": "a1"}))
    assert [row.turn_label for row in training.rows] == ["1, 3", "2"]
    # A record written before turn_indices were kept reads as consecutive calls.
    old = {**records["r0"], "rows": [{k: v for k, v in records["r0"]["rows"][0].items() if k != "turn_indices"}]}
    (training,) = training_records(row_events(1, {"r0": old}, {"r0": "a1"}))
    assert training.rows[0].turn_label == "1-2"
