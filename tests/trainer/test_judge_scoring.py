"""The judge's pure core: the prompt of a group, the reply read as one score per answer, the cache and its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.trainer.judge.cache import ScoreCache
from services.trainer.judge.scoring import (
    JudgeCost,
    JudgeReplyError,
    Score,
    cache_key,
    final_answer,
    parse_scores,
    render_messages,
    task_text,
)


def chat(content: str | None, tool: str | None = None) -> str:
    message: dict = {"role": "assistant", "content": content}
    if tool:
        message["tool_calls"] = [{"function": {"name": tool, "arguments": '{"x": 1}'}}]
    return json.dumps({"choices": [{"message": message}]})


def test_the_answer_is_the_last_response_with_text_and_its_tool_calls() -> None:
    assert final_answer([chat("first"), chat("second"), chat(""), "not json", chat(None)]) == "second"
    assert final_answer([chat("looking", tool="search")]) == 'looking\n[tool call search({"x": 1})]'
    assert final_answer([json.dumps({"choices": [{"text": "completion text"}]})]) == "completion text"
    assert final_answer([]) == ""


def test_the_prompt_numbers_every_answer_under_the_rubric_and_task_and_cuts_long_ones() -> None:
    messages = render_messages(
        "Prefer the capital.", task_text('{"b": 2, "a": "France?"}'), ["Paris", "", "x" * 50], 10
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "## Rubric\nPrefer the capital." in user
    assert '## Task\n{"a": "France?", "b": 2}' in user  # keys sorted: the cache key does not depend on their order
    assert "### Answer 1\nParis" in user and "### Answer 2\n(no answer" in user
    assert "### Answer 3\nxxxxxxxxxx\n[... cut: 40 more characters]" in user
    assert "holding 3 entries" in user


def test_a_reply_becomes_one_score_per_answer_in_answer_order() -> None:
    reply = 'Sure!\n```json\n{"scores": [{"answer": 2, "score": 0.25, "why": "vague"}, {"answer": 1, "score": 1}]}\n```'
    assert parse_scores(reply, 2) == [Score(1.0, ""), Score(0.25, "vague")]
    assert parse_scores('{"scores": [0, 0.5, 1]}', 3) == [Score(0.0), Score(0.5), Score(1.0)]


@pytest.mark.parametrize(
    ("reply", "count", "says"),
    [
        ("They are both fine.", 2, "no JSON object in the judge's reply: 'They are both fine.'"),
        ('{"grades": [1, 0]}', 2, 'no "scores" list'),
        ('{"scores": [1]}', 2, "the judge scored 1 answers, not 2"),
        ('{"scores": [{"answer": 1, "score": 1}, {"answer": 1, "score": 0}]}', 2, "answer 1 is scored twice"),
        ('{"scores": [{"answer": 3, "score": 1}, {"answer": 1, "score": 0}]}', 2, "answer 3 is not one of 1..2"),
        ('{"scores": [7, 0]}', 2, "answer 1: the score 7 is outside [0, 1]"),
        ('{"scores": [{"answer": 1, "score": "high"}]}', 1, "answer 1: the score 'high' is not a number"),
        ('{"scores": [true]}', 1, "is not a number"),
    ],
)
def test_a_reply_that_is_not_one_score_per_answer_is_refused_saying_why(reply: str, count: int, says: str) -> None:
    with pytest.raises(JudgeReplyError) as err:
        parse_scores(reply, count)
    assert says in str(err.value)


def test_the_cache_key_is_the_rubric_task_answer_and_judge_model() -> None:
    key = cache_key("rubric", "task", "answer", "judge")
    assert key == cache_key("rubric", "task", "answer", "judge")
    others = {cache_key("rubric2", "task", "answer", "judge"), cache_key("rubric", "task2", "answer", "judge"),
              cache_key("rubric", "task", "answer2", "judge"), cache_key("rubric", "task", "answer", "judge2"),
              cache_key("rubrict", "ask", "answer", "judge")}  # fmt: skip
    assert key not in others and len(others) == 5


def test_the_cache_file_outlives_the_process_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "run.judge-cache.jsonl"
    first = ScoreCache(path)
    first.put({"k1": Score(0.5, "half"), "k2": Score(1.0)})
    first.put({"k1": Score(0.0, "a second opinion is not taken")})
    with path.open("a") as out:
        out.write('{"key": "k3", "sco')  # a crash mid-line
    again = ScoreCache(path)
    assert len(again) == 2 and again.get("k1") == Score(0.5, "half") and again.get("k3") is None
    assert ScoreCache(None).get("k1") is None


def test_the_cost_is_reported_as_agl_judge_metrics_zeros_included() -> None:
    cost = JudgeCost(calls=2, prompt_tokens=300, cache_hits=1)
    metrics = cost.metrics()
    assert metrics["agl/judge/calls"] == 2.0 and metrics["agl/judge/prompt_tokens"] == 300.0
    assert metrics["agl/judge/failed_groups"] == 0.0 and metrics["agl/judge/cache_hits"] == 1.0
    assert all(name.startswith("agl/judge/") for name in metrics) and len(metrics) == 9
