"""The trainer's ray.init is tried again when Ray's node does not register within Ray's fixed 30 s (a loaded
machine), with what the failed try left killed first; any other failure of ray.init is not retried. Ray's init is
replaced by one that fails as Ray does (the real timeout needs a machine loaded past what a test should do)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from services.trainer import runner

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup or "
    "the GCS has become overloaded."
)

pytestmark = pytest.mark.trainer


def test_a_node_that_times_out_is_started_again_after_its_leftovers_are_killed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    outcomes = [TIMEOUT, TIMEOUT, None]

    def init(**kwargs: Any) -> None:
        calls.append(f"init {kwargs}")
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(runner.ray, "init", init)
    monkeypatch.setattr(runner.ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(runner, "kill_failed_start", lambda watchdog: calls.append(f"kill, sparing {watchdog}"))
    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        runner.start_ray({"num_cpus": 4}, watchdog=4321)
    assert calls == ["init {'num_cpus': 4}", "shutdown", "kill, sparing 4321"] * 2 + ["init {'num_cpus': 4}"]
    tries = [r.message.rsplit("(", 1)[1] for r in caplog.records]
    assert tries == ["try 2 of 3)", "try 3 of 3)"] and "timed out during startup" in caplog.records[0].message


def test_the_third_timeout_and_any_other_error_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    tries = []

    def timing_out(**kwargs: Any) -> None:
        tries.append(1)
        raise TIMEOUT

    monkeypatch.setattr(runner.ray, "init", timing_out)
    monkeypatch.setattr(runner.ray, "shutdown", lambda: None)
    monkeypatch.setattr(runner, "kill_failed_start", lambda watchdog: 0)
    with pytest.raises(Exception, match="timed out during startup"):
        runner.start_ray({})
    assert len(tries) == runner.RAY_START_TRIES

    def refused(**kwargs: Any) -> None:
        tries.append(1)
        raise ValueError("num_cpus must be positive")

    tries.clear()
    monkeypatch.setattr(runner.ray, "init", refused)
    with pytest.raises(ValueError, match="num_cpus"):
        runner.start_ray({})
    assert len(tries) == 1
