"""A starting point's quality: replies read as the engine's hermes parser reads them, the rules that refuse a
start GRPO cannot learn from, and the figures kept in the model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.engine.start_quality import StartQuality, StartRules, parse_reply, record, recorded, refusal
from services.engine.tiny_model import RECIPE_FILE


def quality(**figures: float) -> StartQuality:
    base = dict(
        held_out_accuracy=0.2,
        held_out_tasks=64,
        tool_call_rate=None,
        mixed_group_share=0.3,
        sampled_reward=0.1,
        groups=64,
        group_size=4,
        temperature=1.0,
    )
    return StartQuality(**{**base, **figures})  # type: ignore[arg-type]


def test_a_call_is_parsed_and_the_text_before_it_is_the_content() -> None:
    reply = parse_reply('ok <tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>')
    assert reply["content"] == "ok "
    (call,) = reply["tool_calls"]
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": "2 * 3"}'}


@pytest.mark.parametrize(
    "text",
    ["1234", '<tool_call>{"name": "calc', '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>x</tool_call>"],
)
def test_a_reply_without_a_parsable_call_is_all_content(text: str) -> None:
    assert parse_reply(text) == {"role": "assistant", "content": text}


def test_a_start_without_mixed_groups_is_refused_naming_the_figure_and_the_rule() -> None:
    line = refusal(quality(mixed_group_share=0.0, held_out_accuracy=0.0))
    assert line is not None
    assert "mixed-reward groups 0.000 (64 tasks x 4 samples)" in line and "minimum 0.050" in line


def test_a_start_that_is_never_right_greedily_is_refused() -> None:
    line = refusal(quality(held_out_accuracy=0.0))
    assert line is not None and line.startswith("held-out accuracy 0.000 (64 tasks) under the minimum 0.020")


def test_a_start_that_can_learn_passes_and_the_rules_can_be_set() -> None:
    assert refusal(quality()) is None
    # 1 group in 64 is what a start that learned nothing gets by chance (a 10-step math warm start did).
    assert refusal(quality(mixed_group_share=1 / 64)) is not None
    assert refusal(quality(), StartRules(min_mixed_group_share=0.5)) is not None


def test_the_figures_are_kept_beside_the_recipe_and_read_back(tmp_path: Path) -> None:
    (tmp_path / RECIPE_FILE).write_text(json.dumps({"hidden": 128, "warm_start": {"steps": 3}}))
    assert recorded(tmp_path) is None
    record(tmp_path, quality(tool_call_rate=0.5))
    assert recorded(tmp_path) == quality(tool_call_rate=0.5)
    assert json.loads((tmp_path / RECIPE_FILE).read_text())["warm_start"] == {"steps": 3}
    # Figures of another shape (an older recipe) are no figures: the start is measured again.
    (tmp_path / RECIPE_FILE).write_text(json.dumps({"start_quality": {"accuracy": 1.0}}))
    assert recorded(tmp_path) is None
    assert recorded(tmp_path / "missing") is None
