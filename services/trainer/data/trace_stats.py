"""What a step's rollouts did, as metrics: turns, tool calls and how they went, and the shape of the rows.

Pure. Agent RL fails quietly (tools that never fire, calls that never parse, trajectories that break), so these
are step metrics every step, present even when zero. From the traces (one per rollout), counting every successful
call (validation calls carry no token ids, and count too):

| metric | meaning |
|---|---|
| `{p}/turns/mean`, `{p}/turns/max` | successful model calls per rollout |
| `{p}/tools/call_rate` | share of rollouts with at least one parsed tool call |
| `{p}/tools/calls_per_rollout` | parsed tool calls per rollout |
| `{p}/tools/unparsed_calls` | tool calls written but not parsed by the engine (markers left in the text) |
| `{p}/tools/unknown_tool_calls` | parsed calls naming a tool the request did not offer (empty names too) |
| `{p}/tools/invalid_argument_calls` | parsed calls whose arguments are not a JSON object |
| `{p}/calls/truncated` | calls that stopped at max_tokens (`finish_reason` length) |
| `{p}/calls/failed` | calls that ended in an error (not trained on) |
| `{p}/rollouts/without_calls` | rollouts with no successful model call |

From the rows (`row_metrics`, trajectory aggregation):

| metric | meaning |
|---|---|
| `agl/data/trajectory_breaks` | calls whose prompt continued none of their rollout's earlier rows (each starts a row) |
| `agl/data/segments_per_rollout` | rows per rollout (1.0: every multi-turn rollout is one exact row) |
| `agl/data/context_tokens_per_row` | tokens in rows' responses the model did not sample (tool results...): mask 0 |
| `agl/data/masked_token_fraction` | the share of response tokens that are such context |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from services.trainer.data.aggregation import TRAJECTORY_BREAKS, Row
from services.trainer.data.triplets import RolloutTrace

TRUNCATED = "length"


def trace_metrics(traces: Sequence[RolloutTrace], prefix: str = "agl") -> dict[str, float]:
    """The trace metrics of the table above (empty for no traces)."""
    if not traces:
        return {}
    turns = [len(trace.calls) for trace in traces]
    parsed = unparsed = unknown = invalid = truncated = 0
    with_calls = 0
    for trace in traces:
        rollout_calls = 0
        for call in trace.calls:
            truncated += call.finish_reason == TRUNCATED
            stats = call.tool_calls
            if stats is None:
                continue
            rollout_calls += stats.parsed_calls
            unparsed += stats.unparsed_calls
            unknown += stats.unknown_tool_calls
            invalid += stats.invalid_argument_calls
        parsed += rollout_calls
        with_calls += rollout_calls > 0
    n = len(traces)
    return {
        f"{prefix}/turns/mean": sum(turns) / n,
        f"{prefix}/turns/max": float(max(turns)),
        f"{prefix}/tools/call_rate": with_calls / n,
        f"{prefix}/tools/calls_per_rollout": parsed / n,
        f"{prefix}/tools/unparsed_calls": float(unparsed),
        f"{prefix}/tools/unknown_tool_calls": float(unknown),
        f"{prefix}/tools/invalid_argument_calls": float(invalid),
        f"{prefix}/calls/truncated": float(truncated),
        f"{prefix}/calls/failed": float(sum(trace.failed_calls for trace in traces)),
        f"{prefix}/rollouts/without_calls": float(sum(1 for t in turns if t == 0)),
    }


def row_metrics(rows: Sequence[Row], counts: Counter[str]) -> dict[str, float]:
    """The row metrics of the table above, for the rows built from a step's traces (before alignment)."""
    rollouts = len({row.rollout_id for row in rows})
    response = sum(len(row.response_mask) for row in rows)
    context = sum(len(row.response_mask) - sum(row.response_mask) for row in rows)
    return {
        "agl/data/trajectory_breaks": float(counts.get(TRAJECTORY_BREAKS, 0)),
        "agl/data/segments_per_rollout": len(rows) / rollouts if rollouts else 0.0,
        "agl/data/context_tokens_per_row": context / len(rows) if rows else 0.0,
        "agl/data/masked_token_fraction": context / response if response else 0.0,
    }
