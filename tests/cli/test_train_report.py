"""The step lines and the summary of `agl train` from verl's file-logger records (pure)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from services.cli.train import report
from services.trainer.data import guardrails
from services.trainer.data import step_health as health


def _step(step: int, **data: float) -> dict:
    return {"step": step, "data": data}


def test_progress_bar_counts_steps_and_estimates_the_time_left() -> None:
    assert report.progress_bar(5, 20, 50.0) == "[#####...............] 5/20 eta 2m30s"
    assert report.progress_bar(20, 20, 200.0) == "[####################] 20/20"
    assert report.progress_bar(0, 20, 0.0) == "[....................] 0/20"


def test_step_lines_say_where_a_launch_starts() -> None:
    first = report.step_line(_step(0, **{"val/agl/reward_mean": 0.25}), 10)
    assert first == "step   0/10  held-out reward 0.25 (before training)"
    resumed = report.step_line(_step(4, **{"agl/push/seconds": 0.1}), 10)
    assert resumed == "step   4/10  (resumed from the checkpoint of step 4)"
    line = report.step_line(_step(5, **{"agl/reward/mean": 0.5}), 10, elapsed_s=10.0, val_label="held-out accuracy")
    assert line.startswith("step   5/10  reward 0.50") and line.endswith("[##########..........] 5/10 eta 0m10s")


def test_summary_counts_the_steps_that_trained(tmp_path: Path) -> None:
    skipped = "agl/update/skipped_no_signal"
    records = [
        _step(0, **{"val/agl/reward_mean": 0.1}),
        _step(1, **{"agl/reward/mean": 0.0, skipped: 1.0}),
        _step(2, **{"agl/reward/mean": 0.2, skipped: 0.0, "val/agl/reward_mean": 0.3}),
    ]
    out = io.StringIO()
    figures = report.summary(records, tmp_path, out)
    assert figures == {"steps": 2, "skipped_steps": 1, "trained_steps": 1, "before": 0.1, "after": 0.3}
    assert "steps without a learning signal (every reward of every group equal; the update was skipped): 1 of 2" in (
        out.getvalue()
    )
    nothing = report.summary(records[:2], tmp_path, io.StringIO())
    assert nothing["trained_steps"] == 0
    assert (tmp_path / "reward_curve.png").is_file()


def test_a_step_with_health_warnings_says_so() -> None:
    line = report.step_line(_step(2, **{"agl/reward/mean": 0.5, "agl/health/warnings": 2.0}), 4)
    assert "health warnings 2 (in the trainer log)" in line
    assert "health warnings" not in report.step_line(_step(2, **{"agl/reward/mean": 0.5}), 4)


def test_a_resumed_launch_replaces_the_steps_it_does_again_in_the_history(tmp_path: Path) -> None:
    history = tmp_path / "metrics.jsonl"

    def write(steps: list[int]) -> None:
        history.write_text("".join(f'{{"step": {s}, "data": {{"training/global_step": {s}}}}}\n' for s in steps))

    def steps() -> list[int]:
        return [int(line.split(",")[0].split(":")[1]) for line in history.read_text().splitlines()]

    # Steps 1-3 logged, 3 not yet checkpointed when the trainer stopped; the resume starts at the checkpoint of 2.
    write([0, 1, 2, 3])
    assert report.forget_redone_steps(history, {"step": 2, "data": {"agl/push/engines": 1.0}}) == 1
    assert steps() == [0, 1, 2]
    # A launch whose first record is a step: that step and later ones are redone.
    write([0, 1, 2, 3])
    assert report.forget_redone_steps(history, {"step": 3, "data": {"training/global_step": 3}}) == 1
    assert steps() == [0, 1, 2]
    assert report.forget_redone_steps(history, {"step": 4, "data": {"training/global_step": 4}}) == 0
    assert report.forget_redone_steps(tmp_path / "absent.jsonl", {"step": 1, "data": {}}) == 0


def test_a_step_line_names_its_health_warnings_from_the_trainer_log(tmp_path: Path) -> None:
    """The warnings the trainer's guardrails log (with the trainer's log format) are named on their step's line."""
    log_path = tmp_path / "trainer.log"
    log_path.write_text(
        "2026-01-01 00:00:00,000 WARNING services.trainer.data.guardrails: health warning: step 5: "
        "agl/health/failed_calls=0.5 (1 of 2) over the warning limit 0.05\n"
    )  # an earlier launch's
    warnings = report.TrainerWarnings(log_path)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))  # the trainer's
    logger = logging.getLogger(guardrails.__name__)
    logger.addHandler(handler)
    try:
        step_health = health.StepHealth(
            shares={"truncated_calls": health.Share(31, 32, ["r1"]), "failed_calls": health.Share(0, 32)}
        )
        guard = guardrails.Guardrails(guardrails.parse_limits(None))
        assert guard.enforce(5, step_health, ["truncated_calls", "failed_calls"]) == 1
    finally:
        logger.removeHandler(handler)
        handler.close()
    record = _step(5, **{"agl/reward/mean": 0.5, "agl/health/warnings": 1.0})
    line = report.step_line(record, 10, warnings=warnings.read().get(5, []))
    assert line.endswith("health warnings: truncated_calls=0.9688 (31 of 32)"), line
    assert "failed_calls" not in line  # under its limit here; over it only in the earlier launch's line
