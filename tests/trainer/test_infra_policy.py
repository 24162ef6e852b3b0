"""Infrastructure failures out of the advantage: the selection by policy, and the advantages it leads to, by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from services.trainer.data.adapter import DataPathSettings, build_rows
from services.trainer.data.advantage import rollout_advantages
from services.trainer.data.infra_policy import InfraSettings, Policy, select, wholly_lost
from services.trainer.data.triplets import RolloutTrace, Triplet


def trace(rid: str, group: str, reward: float, *, reason: str = "", attempts: int = 1) -> RolloutTrace:
    ok = not reason
    return RolloutTrace(
        rollout_id=rid,
        group_id=group,
        data_id=group,
        reward=reward,
        triplets=[Triplet([1, 2], [3], [-0.1], 0)],  # a killed or lost agent had made its call
        reward_missing=not ok,
        succeeded=ok,
        failure_reason=reason,
        attempts=attempts,
    )


# Group a: 1, 0, killed, 1. Group b: 0, lost, agent exit (scored 0). Group c: 1, killed (one survivor).
STEP = [
    trace("a0", "a", 1.0),
    trace("a1", "a", 0.0),
    trace("a2", "a", 0.0, reason="KILLED", attempts=2),
    trace("a3", "a", 1.0),
    trace("b0", "b", 0.0),
    trace("b1", "b", 0.0, reason="LOST"),
    trace("b2", "b", 0.0, reason="EXIT_CODE"),
    trace("c0", "c", 1.0),
    trace("c1", "c", 0.0, reason="KILLED"),
]


def advantages(kept: list[RolloutTrace]) -> dict[str, float]:
    rows = build_rows(kept, DataPathSettings(), Counter())
    return {k: round(v, 4) for k, v in rollout_advantages(rows, "grpo").items()}


def test_drop_rollout_normalises_each_group_over_the_rest_and_drops_lone_survivors() -> None:
    selection = select(STEP, InfraSettings(policy=Policy.DROP_ROLLOUT), group_size=4)
    assert [t.rollout_id for t in selection.kept] == ["a0", "a1", "a3", "b0", "b2"]
    assert selection.dropped == ["a2", "b1", "c0", "c1"]
    m = selection.metrics
    assert m["agl/infra/killed"] == 2 and m["agl/infra/lost"] == 1 and m["agl/infra/launch_error"] == 0
    assert m["agl/infra/launcher_died"] == 0 and m["agl/infra/controller_shutdown"] == 0
    assert "agl/infra/timeout" not in m
    assert m["agl/infra/dropped_rollouts"] == 4 and m["agl/infra/dropped_groups"] == 1
    assert m["agl/infra/retried_attempts"] == 1
    # By hand: group a is (1, 0, 1): mean 2/3, unbiased std sqrt(1/3); group b is (0, 0): both 0.
    high = round((1 - 2 / 3) / (3**-0.5 + 1e-6), 4)
    low = round((0 - 2 / 3) / (3**-0.5 + 1e-6), 4)
    assert advantages(selection.kept) == {"a0": high, "a1": low, "a3": high, "b0": 0.0, "b2": 0.0}


def test_drop_group_leaves_out_every_group_with_an_infra_failure() -> None:
    selection = select(STEP, InfraSettings(policy=Policy.DROP_GROUP), group_size=4)
    assert selection.kept == []
    assert selection.metrics["agl/infra/dropped_groups"] == 3
    assert selection.metrics["agl/infra/dropped_rollouts"] == 9
    clean = [trace("d0", "d", 1.0), trace("d1", "d", 0.0)]
    assert [t.rollout_id for t in select([*STEP, *clean], InfraSettings(policy=Policy.DROP_GROUP), 2).kept] == [
        "d0",
        "d1",
    ]


def test_score_keeps_the_old_behaviour_and_still_counts() -> None:
    selection = select(STEP, InfraSettings(policy=Policy.SCORE), group_size=4)
    assert [t.rollout_id for t in selection.kept] == [t.rollout_id for t in STEP]
    assert selection.metrics["agl/infra/killed"] == 2 and selection.metrics["agl/infra/dropped_rollouts"] == 0
    # The killed rollout's fill value 0 pulls group a's mean down to 0.5 (std sqrt(1/3)): the rollouts that scored 1
    # get 0.866 where the clean group gives them 0.577, and the killed one a negative advantage on its call.
    scored = advantages(selection.kept)
    assert scored["a0"] == round(0.5 / (3**-0.5 + 1e-6), 4) == 0.866
    assert scored["a2"] == -0.866


def test_agent_failures_stay_the_agents_score_or_are_skipped() -> None:
    kept = select(STEP, InfraSettings(), group_size=4).kept
    assert "b2" in [t.rollout_id for t in kept]
    skipped = select(STEP, InfraSettings(include_failed=False), group_size=4)
    assert "b2" not in [t.rollout_id for t in skipped.kept]
    assert skipped.metrics["agl/data/skipped_failed_rollouts"] == 1
    assert "b2" not in skipped.dropped  # skipped as the agent's failure, not dropped as infrastructure's
    # Group b is then b0 alone after the lost b1: a lone survivor, dropped.
    assert "b0" in skipped.dropped


@pytest.mark.parametrize(("timeout_is_infra", "kept"), [(False, True), (True, False)])
def test_timeout_is_the_agents_unless_configured(timeout_is_infra: bool, kept: bool) -> None:
    step = [trace("t0", "t", 1.0), trace("t1", "t", 0.0), trace("t2", "t", 0.0, reason="TIMEOUT")]
    selection = select(step, InfraSettings(timeout_is_infra=timeout_is_infra), group_size=3)
    assert ("t2" in [t.rollout_id for t in selection.kept]) is kept
    assert ("agl/infra/timeout" in selection.metrics) is timeout_is_infra


def test_groups_of_one_lose_only_the_failed_rollout() -> None:
    step = [trace("v0", "v0", 1.0), trace("v1", "v1", 0.0, reason="LAUNCHER_DIED")]
    selection = select(step, InfraSettings(), group_size=1)
    assert [t.rollout_id for t in selection.kept] == ["v0"]
    assert selection.metrics["agl/infra/launcher_died"] == 1 and selection.metrics["agl/infra/dropped_groups"] == 1


def test_an_agent_that_failed_on_its_engines_failure_is_an_infrastructure_failure() -> None:
    from collections import Counter as Counts

    from services._gen.agl.v1 import event_pb2
    from services.trainer.data.triplets import trace_from_events
    from tests.trainer.events import call, reward

    error = event_pb2.MODEL_REQUEST_STATUS_ERROR

    def built(events: list, *, succeeded: bool = False, reason: str = "EXIT_CODE", rid: str = "r") -> RolloutTrace:
        return trace_from_events(
            rid, "g", "g", events, reward_fillna_value=0.0, counts=Counts(), succeeded=succeeded, failure_reason=reason
        )

    ok = call([1, 2], [3])
    # The proxy answered 502 (the engine died or refused the connection) or 504 (it timed out), then the agent
    # exited non-zero: the engine's failure.
    assert built([ok, call([1], [], status=error, http_status=502)]).failure_reason == "ENGINE_FAILED"
    assert built([call([1], [], status=error, http_status=504)], reason="").failure_reason == "ENGINE_FAILED"
    # 503: every engine held back (restarted, not yet given the current weights), or the engine overloaded.
    assert built([ok, call([1], [], status=error, http_status=503)]).failure_reason == "ENGINE_FAILED"
    # The agent's own: a request the engine refused (400), an engine failure it recovered from before failing,
    # a rollout that succeeded anyway, and a reason the ledger already gave.
    assert built([call([1], [], status=error, http_status=400)]).failure_reason == "EXIT_CODE"
    assert built([call([1], [], status=error, http_status=502), ok]).failure_reason == "EXIT_CODE"
    assert built([call([1], [], status=error, http_status=502), reward(1.0)], succeeded=True, reason="").succeeded
    assert built([call([1], [], status=error, http_status=502)], reason="TIMEOUT").failure_reason == "TIMEOUT"
    assert built([call([1], [], status=error, http_status=502)], reason="KILLED").failure_reason == "KILLED"

    # Left out like the ledger's infrastructure reasons, counted under its own name, never asked of the ledger.
    engine = built([ok, call([1], [], status=error, http_status=502)], rid="a3")
    step = [trace("a0", "g", 1.0), trace("a1", "g", 0.0), trace("a2", "g", 1.0), engine]
    selection = select(step, InfraSettings(), group_size=4)
    assert [t.rollout_id for t in selection.kept] == ["a0", "a1", "a2"] and selection.dropped == ["a3"]
    assert selection.metrics["agl/infra/engine_failed"] == 1.0
    assert "ENGINE_FAILED" in InfraSettings().reasons and "ENGINE_FAILED" not in InfraSettings().retried_reasons


def test_a_step_is_wholly_lost_only_when_every_rollout_failed_for_the_infrastructure() -> None:
    lost = [trace("a0", "a", 0.0, reason="KILLED"), trace("b0", "b", 0.0, reason="ENGINE_FAILED")]
    assert wholly_lost(lost, InfraSettings())
    # One agent failure, one success, a timeout (the agent's by default) or nothing consumed: not lost.
    assert not wholly_lost([*lost, trace("c0", "c", 0.0, reason="EXIT_CODE")], InfraSettings())
    assert not wholly_lost([*lost, trace("c0", "c", 1.0)], InfraSettings())
    timed_out = [*lost, trace("c0", "c", 0.0, reason="TIMEOUT")]
    assert not wholly_lost(timed_out, InfraSettings())
    assert wholly_lost(timed_out, InfraSettings(timeout_is_infra=True))
    assert not wholly_lost([], InfraSettings())
