"""Step health: what one step consumed says about the run, as named shares, each with the rollouts that show it.

Pure, and cheap (one pass over the traces, one over the rows). Every metric is present every step, zero included,
so a curve never has holes and a limit (services/trainer/data/guardrails.py) can be checked on each. Values are shares
in [0, 1] unless said otherwise; `{p}` is `agl/health` for training steps, `val/agl/health` for validation.

- `{p}/rollouts_without_calls`: consumed rollouts with no successful model call (a wrong base URL, a crash first),
  of those that did not fail for an infrastructure reason (an agent whose engine was away for longer than it
  waits says nothing about the agent: that is `infra_failed_rollouts` and `engine_unavailable_calls`)
- `{p}/succeeded_without_reward`: succeeded rollouts that posted no reward (they train on the fill value)
- `{p}/reward_before_last_call`: rollouts with a reward whose reward came before their last model call
- `{p}/failed_calls`: model calls that ended in an error (an HTTP status, the transport), other than
  `engine_unavailable_calls`
- `{p}/engine_unavailable_calls`: model calls the proxy answered 502, 503 or 504: no engine could answer (one
  dead, restarting and held back, or past the proxy's timeout). A rollout that recovered from them trains as
  usual; one whose agent failed on them is an infrastructure failure (`ENGINE_FAILED`)
- `{p}/truncated_calls`: successful calls cut at max_tokens (`finish_reason` length)
- `{p}/bad_tool_calls`: tool calls the model wrote that did not parse, named an unknown tool or carried
  arguments that are not a JSON object, of all it wrote (the proxy's ToolCallStats)
- `{p}/failed_rollouts`: consumed rollouts that failed, for any reason
- `{p}/infra_failed_rollouts`: consumed rollouts that failed for an infrastructure reason (data/infra_policy.py)
- `agl/health/trajectory_breaks`: continued calls whose prompt continued none of their rollout's earlier rows (a
  template that re-renders the history, a new conversation such as a sub-agent's first call); each starts an exact
  segment row
- `agl/health/dropped_rows`: rows built that were dropped (prompt over `max_prompt_length`)
- `agl/health/truncated_rows`: rows kept whose response was cut at `max_response_length`
- `agl/health/masked_tokens`: response tokens the model did not sample (context, loss mask 0)
- `agl/health/no_signal_groups`: trained groups whose rollouts all got the same reward (zero advantage)
- `agl/health/identical_reward_steps` (a count): consecutive steps, this one included, in which every trained
  rollout got the same reward
- `agl/health/logprob_gap` (nats): mean absolute gap between the engine's sampling log-probs and the trainer's
  on the trained tokens (present on steps that computed the old log-probs)
- `agl/health/judge_failed_groups`: consumed groups the judge could not score (its endpoint failing, or replies
  that are no score per answer, after its retries), left out of the step (present with a judge: agl.judge)
- `agl/health/warnings` (a count): limits passed at the warning level this step; `agl/health/stopped`: 1 on the
  step that stopped the run
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from services.trainer.data.aggregation import (
    DROPPED_PROMPT_TOO_LONG,
    MERGED_CALLS,
    TRAJECTORY_BREAKS,
    TRUNCATED_RESPONSES,
    Row,
)
from services.trainer.data.triplets import RolloutTrace

TRAIN_PREFIX = "agl/health"
VAL_PREFIX = "val/agl/health"
TRUNCATED = "length"

ROLLOUTS_WITHOUT_CALLS = "rollouts_without_calls"
SUCCEEDED_WITHOUT_REWARD = "succeeded_without_reward"
REWARD_BEFORE_LAST_CALL = "reward_before_last_call"
FAILED_CALLS = "failed_calls"
ENGINE_UNAVAILABLE_CALLS = "engine_unavailable_calls"
TRUNCATED_CALLS = "truncated_calls"
BAD_TOOL_CALLS = "bad_tool_calls"
FAILED_ROLLOUTS = "failed_rollouts"
INFRA_FAILED_ROLLOUTS = "infra_failed_rollouts"
TRAJECTORY_BREAK_SHARE = "trajectory_breaks"
DROPPED_ROWS = "dropped_rows"
TRUNCATED_ROWS = "truncated_rows"
MASKED_TOKENS = "masked_tokens"
NO_SIGNAL_GROUPS = "no_signal_groups"
IDENTICAL_REWARD_STEPS = "identical_reward_steps"
LOGPROB_GAP = "logprob_gap"
JUDGE_FAILED_GROUPS = "judge_failed_groups"

TRACE_NAMES = (
    ROLLOUTS_WITHOUT_CALLS,
    SUCCEEDED_WITHOUT_REWARD,
    REWARD_BEFORE_LAST_CALL,
    FAILED_CALLS,
    ENGINE_UNAVAILABLE_CALLS,
    TRUNCATED_CALLS,
    BAD_TOOL_CALLS,
    FAILED_ROLLOUTS,
    INFRA_FAILED_ROLLOUTS,
)
ROW_NAMES = (TRAJECTORY_BREAK_SHARE, DROPPED_ROWS, TRUNCATED_ROWS, MASKED_TOKENS)
GROUP_NAMES = (NO_SIGNAL_GROUPS, IDENTICAL_REWARD_STEPS)
JUDGE_NAMES = (JUDGE_FAILED_GROUPS,)
NAMES = (*TRACE_NAMES, *ROW_NAMES, *GROUP_NAMES, LOGPROB_GAP, *JUDGE_NAMES)

# aggregation's counter keys whose rollouts are recorded (RowFlags) for the row metrics' evidence.
FLAGGED_COUNTS = (TRAJECTORY_BREAKS, DROPPED_PROMPT_TOO_LONG, TRUNCATED_RESPONSES)


@dataclass
class Share:
    """One health value: `part` of `whole` (a share), and the rollouts that make up `part`."""

    part: float
    whole: float
    rollouts: list[str] = field(default_factory=list)

    @property
    def value(self) -> float:
        return self.part / self.whole if self.whole else 0.0


@dataclass
class StepHealth:
    """Health values by short name (`NAMES`) with their evidence; `metrics(prefix)` names them in full."""

    shares: dict[str, Share] = field(default_factory=dict)
    # Values that are not shares (a count of steps, a log-prob gap), and the rollouts behind them where known.
    values: dict[str, float] = field(default_factory=dict)
    value_rollouts: dict[str, list[str]] = field(default_factory=dict)

    def value(self, name: str) -> float:
        share = self.shares.get(name)
        return share.value if share is not None else self.values.get(name, 0.0)

    def rollouts(self, name: str) -> list[str]:
        share = self.shares.get(name)
        return share.rollouts if share is not None else self.value_rollouts.get(name, [])

    def update(self, other: StepHealth) -> None:
        self.shares.update(other.shares)
        self.values.update(other.values)
        self.value_rollouts.update(other.value_rollouts)

    def metrics(self, prefix: str = TRAIN_PREFIX) -> dict[str, float]:
        out = {f"{prefix}/{name}": share.value for name, share in self.shares.items()}
        out.update({f"{prefix}/{name}": value for name, value in self.values.items()})
        return out


def trace_health(traces: Sequence[RolloutTrace], infra_reasons: Iterable[str]) -> StepHealth:
    """The trace metrics of the table, over every consumed rollout (failed ones included)."""
    infra = frozenset(infra_reasons)
    no_calls: list[str] = []
    no_reward: list[str] = []
    early_reward: list[str] = []
    failed_call_ids: list[str] = []
    unavailable_ids: list[str] = []
    truncated_ids: list[str] = []
    bad_tool_ids: list[str] = []
    failed: list[str] = []
    infra_failed: list[str] = []
    succeeded = rewarded = calls = ok_calls = failed_calls = unavailable = truncated = tool_written = bad_tools = 0
    for trace in traces:
        rid = trace.rollout_id
        infra_failure = not trace.succeeded and trace.failure_reason in infra
        if not trace.calls and not infra_failure:
            no_calls.append(rid)
        if trace.succeeded:
            succeeded += 1
            if trace.reward_missing:
                no_reward.append(rid)
        else:
            failed.append(rid)
            if trace.failure_reason in infra:
                infra_failed.append(rid)
        if not trace.reward_missing:
            rewarded += 1
            if trace.reward_before_last_call:
                early_reward.append(rid)
        ok_calls += len(trace.calls)
        calls += len(trace.calls) + trace.failed_calls
        if trace.failed_calls > trace.engine_unavailable_calls:
            failed_calls += trace.failed_calls - trace.engine_unavailable_calls
            failed_call_ids.append(rid)
        if trace.engine_unavailable_calls:
            unavailable += trace.engine_unavailable_calls
            unavailable_ids.append(rid)
        cut = bad = 0
        for call in trace.calls:
            cut += call.finish_reason == TRUNCATED
            stats = call.tool_calls
            if stats is not None:
                tool_written += stats.parsed_calls + stats.unparsed_calls
                bad += stats.unparsed_calls + stats.unknown_tool_calls + stats.invalid_argument_calls
        if cut:
            truncated += cut
            truncated_ids.append(rid)
        if bad:
            bad_tools += bad
            bad_tool_ids.append(rid)
    n = len(traces)
    return StepHealth(
        shares={
            ROLLOUTS_WITHOUT_CALLS: Share(len(no_calls), n - len(infra_failed), no_calls),
            SUCCEEDED_WITHOUT_REWARD: Share(len(no_reward), succeeded, no_reward),
            REWARD_BEFORE_LAST_CALL: Share(len(early_reward), rewarded, early_reward),
            FAILED_CALLS: Share(failed_calls, calls, failed_call_ids),
            ENGINE_UNAVAILABLE_CALLS: Share(unavailable, calls, unavailable_ids),
            TRUNCATED_CALLS: Share(truncated, ok_calls, truncated_ids),
            # An unknown name or bad arguments are faults of a parsed call: a share over the calls written can
            # pass 1 only if the proxy counted one call twice, so it is capped.
            BAD_TOOL_CALLS: Share(min(bad_tools, tool_written), tool_written, bad_tool_ids),
            FAILED_ROLLOUTS: Share(len(failed), n, failed),
            INFRA_FAILED_ROLLOUTS: Share(len(infra_failed), n, infra_failed),
        }
    )


@dataclass
class RowFlags:
    """Which rollouts each flagged aggregation count came from (filled while the rows are built)."""

    rollouts: dict[str, list[str]] = field(default_factory=lambda: {key: [] for key in FLAGGED_COUNTS})

    def note(self, rollout_id: str, before: Mapping[str, int], after: Mapping[str, int]) -> None:
        for key in FLAGGED_COUNTS:
            if after.get(key, 0) > before.get(key, 0):
                self.rollouts[key].append(rollout_id)


def row_health(rows: Sequence[Row], counts: Counter[str], flags: RowFlags) -> StepHealth:
    """The row metrics of the table, for the rows built from the step's traces (after the length limits)."""
    breaks = counts.get(TRAJECTORY_BREAKS, 0)
    continued = breaks + counts.get(MERGED_CALLS, 0)
    dropped = counts.get(DROPPED_PROMPT_TOO_LONG, 0)
    truncated = counts.get(TRUNCATED_RESPONSES, 0)
    response = context = 0
    for row in rows:
        length = len(row.response_mask)
        response += length
        context += length - sum(row.response_mask)
    return StepHealth(
        shares={
            TRAJECTORY_BREAK_SHARE: Share(breaks, continued, flags.rollouts[TRAJECTORY_BREAKS]),
            DROPPED_ROWS: Share(dropped, len(rows) + dropped, flags.rollouts[DROPPED_PROMPT_TOO_LONG]),
            TRUNCATED_ROWS: Share(truncated, len(rows), flags.rollouts[TRUNCATED_RESPONSES]),
            MASKED_TOKENS: Share(context, response),
        }
    )


def group_health(traces: Sequence[RolloutTrace], identical_steps_before: int) -> StepHealth:
    """Groups without a learning signal among the trained rollouts, and the run of steps whose rewards were all one
    value (`identical_steps_before`: that count at the previous step)."""
    by_group: dict[str, list[RolloutTrace]] = {}
    for trace in traces:
        by_group.setdefault(trace.group_id, []).append(trace)
    flat: list[str] = []
    flat_groups = 0
    for members in by_group.values():
        rewards = {t.reward for t in members}
        if len(members) > 1 and len(rewards) == 1:
            flat_groups += 1
            flat.extend(t.rollout_id for t in members)
    identical = len(traces) > 1 and len({t.reward for t in traces}) == 1
    return StepHealth(
        shares={NO_SIGNAL_GROUPS: Share(flat_groups, len(by_group), flat)},
        values={IDENTICAL_REWARD_STEPS: float(identical_steps_before + 1 if identical else 0)},
        value_rollouts={IDENTICAL_REWARD_STEPS: [t.rollout_id for t in traces] if identical else []},
    )


def judge_health(failed: Sequence[tuple[str, Sequence[str]]], groups: int) -> StepHealth:
    """The groups the judge could not score, of the `groups` consumed: (group id, its rollout ids) each."""
    rollouts = [rollout_id for _, ids in failed for rollout_id in ids]
    return StepHealth(shares={JUDGE_FAILED_GROUPS: Share(len(failed), groups, rollouts)})
