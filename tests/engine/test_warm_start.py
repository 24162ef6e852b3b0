"""The warm start's probe: it stops inside the band, and a model that went past the band between two checks is
taken back to the previous check and looked at more often, once."""

from __future__ import annotations

import json
from pathlib import Path

from services.engine.tiny_model import RECIPE_FILE, build_tiny_model
from services.engine.warm_start import warm_start

EXAMPLES = [([{"role": "user", "content": f"{a} + {b}"}], str(a + b)) for a in range(5) for b in range(5)]


def run(tmp_path: Path, scores: dict[int, float], steps: int = 40) -> tuple[list[int], int]:
    model = build_tiny_model(tmp_path / "model", hidden=64, layers=1)
    asked: list[int] = []

    def probe(model: object, tokenizer: object, step: int) -> float:
        asked.append(step)
        return scores.get(step, 0.0)

    result = warm_start(
        model, EXAMPLES, steps=steps, batch_size=4, probe=probe, stop_band=(0.2, 0.45), check_every=10, threads=1
    )
    assert json.loads((model / RECIPE_FILE).read_text())["warm_start"]["steps"] == result.steps
    return asked, result.steps


def test_a_score_inside_the_band_stops_the_run_there(tmp_path: Path) -> None:
    asked, trained = run(tmp_path, {20: 0.3})
    assert asked == [10, 20] and trained == 20


def test_past_the_band_it_goes_back_one_check_and_looks_five_times_as_often(tmp_path: Path) -> None:
    asked, trained = run(tmp_path, {20: 0.9, 14: 0.25})
    assert asked == [10, 20, 12, 14] and trained == 14


def test_past_the_band_again_at_the_finer_pace_it_stops_there(tmp_path: Path) -> None:
    asked, trained = run(tmp_path, {20: 0.9, 12: 0.1, 14: 0.7})
    assert asked == [10, 20, 12, 14] and trained == 14


def test_never_in_the_band_it_runs_every_step(tmp_path: Path) -> None:
    asked, trained = run(tmp_path, {})
    assert asked == [10, 20, 30] and trained == 40


def test_progress_is_a_line_every_tenth_of_the_steps_and_a_string_prompt_is_taken_as_rendered(tmp_path: Path) -> None:
    import io

    from services.engine.warm_start import progress_lines

    model = build_tiny_model(tmp_path / "model", hidden=64, layers=1)
    out = io.StringIO()
    # A prompt already rendered by the chat template (a call kept from an earlier run) beside chat messages.
    examples = [*EXAMPLES[:4], ("<|im_start|>user\n1 + 1<|im_end|>\n<|im_start|>assistant\n", "2")]
    warm_start(model, examples, steps=20, batch_size=4, threads=1, on_step=progress_lines(out, "start", 20))
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"start: step {step}/20" for step in range(2, 21, 2)]
    assert lines[-1].endswith("~0s left")
