"""Guardrails: limits parsed (and refused) from the config, evaluated on step health, the stop lines."""

from __future__ import annotations

import logging

import pytest
from hydra import compose, initialize_config_dir

from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError, settings_from_config
from services.trainer.data import step_health as h
from services.trainer.data.guardrails import (
    DEFAULT_LIMITS,
    Guardrails,
    HealthStop,
    Limit,
    all_failed_line,
    evaluate,
    parse_limits,
)
from services.trainer.data.infra_policy import Policy
from services.trainer.data.triplets import RolloutTrace


def step_health(**shares: tuple[float, float, list[str]]) -> h.StepHealth:
    return h.StepHealth(shares={name: h.Share(part, whole, ids) for name, (part, whole, ids) in shares.items()})


def test_a_value_over_the_stop_limit_gives_one_line_with_metric_value_limit_and_rollouts() -> None:
    ids = [f"run-s3-g{i}-r0" for i in range(7)]
    health = step_health(rollouts_without_calls=(7, 8, ids))
    breaches = evaluate(3, health, h.TRACE_NAMES, DEFAULT_LIMITS, most=3)
    assert [(b.name, b.level) for b in breaches] == [("rollouts_without_calls", "stop")]
    assert breaches[0].line == (
        "step 3: agl/health/rollouts_without_calls=0.875 (7 of 8) over the stop limit 0.5; "
        "rollouts: run-s3-g0-r0, run-s3-g1-r0, run-s3-g2-r0 and 4 more"
    )
    with pytest.raises(HealthStop) as stopped:
        Guardrails(DEFAULT_LIMITS, most_rollouts=3).enforce(3, health, h.TRACE_NAMES)
    assert str(stopped.value) == breaches[0].line


def test_between_the_limits_is_a_warning_line_and_at_a_limit_is_nothing(caplog: pytest.LogCaptureFixture) -> None:
    guard = Guardrails(DEFAULT_LIMITS)
    warn = step_health(rollouts_without_calls=(1, 4, ["r1"]), failed_calls=(1, 20, ["r2"]))  # 0.25 and 0.05
    with caplog.at_level(logging.WARNING, logger="services.trainer.data.guardrails"):
        assert guard.enforce(1, warn, h.TRACE_NAMES) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "health warning: step 1: agl/health/rollouts_without_calls=0.25 (1 of 4) over the warning limit 0.1; "
        "rollouts: r1"
    ]
    # Only the names asked for are checked.
    assert guard.enforce(1, warn, [h.FAILED_CALLS]) == 0


def test_stops_come_before_warnings_and_values_without_a_share_have_no_amount() -> None:
    health = step_health(bad_tool_calls=(3, 10, ["t"]))
    health.update(h.StepHealth(values={h.LOGPROB_GAP: 0.9}))
    breaches = evaluate(2, health, [h.BAD_TOOL_CALLS, h.LOGPROB_GAP], DEFAULT_LIMITS, min_count=8)
    assert [(b.name, b.level) for b in breaches] == [("logprob_gap", "stop"), ("bad_tool_calls", "warn")]
    assert breaches[0].line == "step 2: agl/health/logprob_gap=0.9 over the stop limit 0.5"


def test_a_share_over_too_few_items_warns_instead_of_stopping(caplog: pytest.LogCaptureFixture) -> None:
    few = step_health(bad_tool_calls=(4, 4, ["t0", "t1"]))
    guard = Guardrails(DEFAULT_LIMITS, min_count=8)
    with caplog.at_level(logging.WARNING, logger="services.trainer.data.guardrails"):
        assert guard.enforce(3, few, [h.BAD_TOOL_CALLS]) == 1
    assert caplog.records[0].getMessage() == (
        "health warning: step 3: agl/health/bad_tool_calls=1 (4 of 4) over the stop limit 0.9, but only 4 counted "
        "(fewer than agl.health.min_count=8): a warning; rollouts: t0, t1"
    )
    with pytest.raises(HealthStop):
        Guardrails(DEFAULT_LIMITS, min_count=4).enforce(3, few, [h.BAD_TOOL_CALLS])
    # Values that are not shares (a log-prob gap) have no count: their stop stands.
    with pytest.raises(HealthStop):
        guard.enforce(3, h.StepHealth(values={h.LOGPROB_GAP: 0.6}), [h.LOGPROB_GAP])


def trace(rid: str, *, ok: bool = False, reason: str = "EXIT_CODE", error: str = "") -> RolloutTrace:
    return RolloutTrace(rid, "g", "d", 0.0, succeeded=ok, failure_reason="" if ok else reason, error_message=error)


def test_every_rollout_failed_names_the_first_agent_error() -> None:
    traces = [
        trace("r0", reason="KILLED", error="agent killed by SIGKILL (log: /logs/r0.log)"),
        trace("r1", error="agent exited with code 1 (log: /logs/r1.log): ValueError: no answer"),
        trace("r2", error="agent exited with code 1 (log: /logs/r2.log): ValueError: no answer"),
    ]
    assert all_failed_line(4, traces, ["KILLED"]) == (
        "step 4: every rollout failed (3 of 3); first: rollout r1 (EXIT_CODE): agent exited with code 1 "
        "(log: /logs/r1.log): ValueError: no answer"
    )
    # All of them the infrastructure's: the first of those.
    assert all_failed_line(4, traces[:1], ["KILLED"]) == (
        "step 4: every rollout failed (1 of 1); first: rollout r0 (KILLED): agent killed by SIGKILL (log: /logs/r0.log)"
    )
    assert all_failed_line(4, [*traces, trace("ok", ok=True)], ["KILLED"]) is None
    assert all_failed_line(4, [], ["KILLED"]) is None


def test_limits_over_the_defaults_and_every_refusal() -> None:
    limits = parse_limits({"rollouts_without_calls": {"stop": None}, "logprob_gap": {"warn": 0.01, "stop": 0.1}})
    assert limits["rollouts_without_calls"] == Limit(0.1, None)
    assert limits["logprob_gap"] == Limit(0.01, 0.1)
    assert limits["failed_calls"] == DEFAULT_LIMITS["failed_calls"]
    refused = {
        "no_such_metric": {"stop": 1},
        "failed_calls": {"warn": 0.6, "stop": 0.5},
        "dropped_rows": {"stop": -1},
        "truncated_rows": {"stop": "high"},
        "masked_tokens": {"maximum": 1},
        "bad_tool_calls": 0.5,
    }
    for name, levels in refused.items():
        with pytest.raises(ValueError, match=f"limits.{name}"):
            parse_limits({name: levels})


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(
            config_name=CONFIG_NAME,
            overrides=["agl.launch.agent_class=examples.math_agent:Agent", "data.train_files=/tmp/t.jsonl", *overrides],
        )


def test_config_keys_reach_the_settings() -> None:
    settings = settings_from_config(
        compose_cfg(
            "agl.infra_failures.policy=drop_group",
            "agl.infra_failures.retry_attempts=3",
            "agl.infra_failures.timeout_is_infra=true",
            "agl.infra_failures.step_redos=0",
            "agl.infra_failures.redo_wait_seconds=12.5",
            "agl.include_failed=false",
            "+agl.health.limits.rollouts_without_calls.stop=0.9",
            "agl.health.rollouts_named=2",
            "agl.health.min_count=3",
        )
    )
    assert settings.health_min_count == 3
    assert settings.infra.policy is Policy.DROP_GROUP and settings.infra.timeout_is_infra
    assert not settings.infra.include_failed
    assert settings.infra.step_redos == 0 and settings.infra.redo_wait_s == 12.5
    assert settings.health_limits["rollouts_without_calls"] == Limit(0.1, 0.9)
    assert settings.health_rollouts_named == 2
    retry = settings.manager.launch.to_proto().retry
    assert retry.max_attempts == 3
    assert {r for r in retry.retry_on} == {2, 3, 4, 5, 6, 8}  # KILLED TIMEOUT LAUNCH_ERROR LOST LAUNCHER_DIED SHUTDOWN
    default = settings_from_config(compose_cfg())
    assert default.manager.launch.to_proto().retry.max_attempts == 2
    assert default.infra.step_redos == 2 and default.infra.redo_wait_s == 600.0
    assert 3 not in default.manager.launch.to_proto().retry.retry_on  # a timeout is the agent's by default
    single = settings_from_config(compose_cfg("agl.infra_failures.retry_attempts=1"))
    assert not single.manager.launch.to_proto().HasField("retry")
    assert settings_from_config(compose_cfg("agl.trajectory_log=/tmp/t.jsonl")).manager.validation_call_texts


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agl.infra_failures.policy=retry", "agl.infra_failures.policy=retry: one of drop_rollout, drop_group, score"),
        ("agl.infra_failures.retry_attempts=0", "agl.infra_failures.retry_attempts=0: an integer from 1"),
        ("agl.infra_failures.timeout_is_infra=maybe", "agl.infra_failures.timeout_is_infra='maybe': true or false"),
        ("+agl.infra_failures.max_retries=3", "agl.infra_failures.max_retries: unknown key"),
        ("agl.infra_failures.step_redos=-1", "agl.infra_failures.step_redos=-1: an integer from 0 (the run stops)"),
        ("agl.infra_failures.step_redos=1.5", "agl.infra_failures.step_redos=1.5: an integer from 0"),
        ("agl.infra_failures.redo_wait_seconds=0", "agl.infra_failures.redo_wait_seconds=0: seconds, above 0"),
        ("agl.infra_failures.redo_wait_seconds=soon", "agl.infra_failures.redo_wait_seconds='soon': seconds"),
        ("+agl.health.limits.no_calls.stop=0.5", "agl.health.limits.no_calls: not a health metric"),
        ("+agl.health.limits.failed_calls.warn=0.9", "agl.health.limits.failed_calls: warn=0.9 above stop=0.5"),
        ("agl.health.rollouts_named=0", "agl.health.rollouts_named=0: an integer >= 1"),
        ("+agl.health.stop_all=true", "agl.health.stop_all: unknown key"),
        ("agl.health.min_count=0", "agl.health.min_count=0: an integer >= 1"),
    ],
)
def test_invalid_config_is_refused_with_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_config(compose_cfg(override))
    assert str(refused.value).startswith(message), str(refused.value)


def test_the_guardrail_cores_import_neither_grpc_nor_ray() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import services.trainer.data.guardrails, services.trainer.data.step_health\n"
        "import services.trainer.data.infra_policy, services.trainer.data.row_records\n"
        "print(sorted(m for m in ('grpc', 'ray', 'torch', 'verl') if m in sys.modules))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
