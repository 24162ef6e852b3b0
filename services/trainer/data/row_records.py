"""Each token's fate, kept with its rollout: what the trainer made of a consumed rollout, as one ledger event.

Pure. After a step, every consumed training rollout gets an `agl_training_rows` event (JSON in `data_json`, a stable
event id per step so a repeated append adds nothing) that the console draws under the rollout's calls:

    {"step": 3, "reward": 1.0, "advantage": 0.87, "kept": true, "left_out": "",
     "flags": ["trajectory_breaks"],                  # the health metrics this rollout counts in
     "rows": [{"segment": 0, "segments": 2, "first_turn": 0, "turns": 2, "turn_indices": [0, 2],
               "break_before": false, "trained": true,
               "prompt_tokens": 37, "tokens": ["Hel", "lo"], "ids": [..], "mask": [1, 0],
               "engine_logprobs": [..] | null, "trainer_logprobs": [..] | null}]}

`mask` is the loss mask of the response part (1: sampled by the engine, trained on; 0: context the agent added);
`engine_logprobs` are the engine's sampling log-probs (0 on context), `trainer_logprobs` the actor's recomputation
on the same tokens (present when the step computed them: it trained). A segment after the first starts where the
rollout's history stopped being a pure append (`break_before`). Left-out rollouts (an infrastructure failure, an
agent failure with `include_failed` false) get the record too, with no rows and the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from services._gen.agl.v1 import event_pb2
from services.trainer.data.aggregation import Row
from services.trainer.data.triplets import RolloutTrace

EVENT_TYPE = "agl_training_rows"
# Bytes of record JSON per append (the ledger takes messages of up to 64 MB by default).
ROW_APPEND_BYTES = 8 * 1024 * 1024

TokenText = Callable[[Sequence[int]], list[str]]


def _rounded(values: Sequence[float] | None) -> list[float] | None:
    return None if values is None else [round(float(v), 6) for v in values]


def row_records(
    step: int,
    traces: Sequence[RolloutTrace],
    kept_ids: set[str],
    left_out: Mapping[str, str],
    rows: Sequence[Row],
    advantages: Mapping[str, float],
    trained: set[tuple[str, int]],
    recomputed: Mapping[tuple[str, int], Sequence[float]],
    flags: Mapping[str, Sequence[str]],
    token_text: TokenText,
) -> dict[str, dict]:
    """The record of each consumed rollout, by rollout id. `trained`: (rollout id, first turn) of the rows that went
    into the update; `recomputed`: the trainer's log-probs of those rows' response tokens; `flags`: rollout id ->
    the health metric names it counts in."""
    by_rollout: dict[str, list[Row]] = {}
    for row in rows:
        by_rollout.setdefault(row.rollout_id, []).append(row)
    records: dict[str, dict] = {}
    for trace in traces:
        rid = trace.rollout_id
        mine = by_rollout.get(rid, [])
        out_rows = []
        for index, row in enumerate(mine):
            key = (rid, row.turn_index)
            out_rows.append(
                {
                    "segment": index,
                    "segments": len(mine),
                    "first_turn": row.turn_index,
                    "turns": row.num_turns,
                    "turn_indices": list(row.turn_indices),
                    "break_before": index > 0,
                    "trained": key in trained,
                    "prompt_tokens": len(row.prompt_ids),
                    "tokens": token_text(row.response_ids),
                    "ids": list(row.response_ids),
                    "mask": list(row.response_mask),
                    "engine_logprobs": _rounded(row.logprobs),
                    "trainer_logprobs": _rounded(recomputed.get(key)),
                }
            )
        advantage = advantages.get(rid)
        records[rid] = {
            "step": step,
            "reward": trace.reward,
            "reward_missing": trace.reward_missing,
            "advantage": None if advantage is None else round(float(advantage), 6),
            "kept": rid in kept_ids,
            "left_out": left_out.get(rid, ""),
            "flags": sorted(flags.get(rid, ())),
            "rows": out_rows,
        }
    return records


def flags_by_rollout(evidence: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """metric name -> rollout ids, turned into rollout id -> metric names."""
    out: dict[str, list[str]] = {}
    for name, ids in evidence.items():
        for rid in ids:
            out.setdefault(rid, []).append(name)
    return out


def row_events(step: int, records: Mapping[str, dict], attempts: Mapping[str, str]) -> list[event_pb2.Event]:
    """The records as events of each rollout's final attempt, with an id that makes a repeated append a no-op."""
    return [
        event_pb2.Event(
            rollout_id=rid,
            attempt_id=attempts.get(rid, ""),
            event_id=f"agl-rows-s{step}",
            event_type=EVENT_TYPE,
            data_json=json.dumps(record, separators=(",", ":"), ensure_ascii=False),
        )
        for rid, record in records.items()
    ]


def event_chunks(events: Sequence[event_pb2.Event], max_bytes: int) -> list[list[event_pb2.Event]]:
    """The events in order, in lists of at most max_bytes of data_json each (one event alone may be more)."""
    chunks: list[list[event_pb2.Event]] = []
    size = 0
    for event in events:
        length = len(event.data_json)
        if chunks and size + length <= max_bytes:
            chunks[-1].append(event)
            size += length
        else:
            chunks.append([event])
            size = length
    return chunks
