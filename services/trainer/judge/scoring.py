"""The judge's pure core: one GRPO group as one chat prompt, the judge's reply as one score per answer.

Guarantee: a reply becomes exactly one score in [0, 1] per answer shown, in the order they were shown, or it is
refused with JudgeReplyError saying what was wrong; nothing is guessed (a score the judge left out is not a 0).

The judge sees the task (the rollout input, as JSON), the rubric, and every answer of the group at once, numbered,
so that it scores them against each other (GRPO only uses how a group's rewards differ). It answers JSON:
`{"scores": [{"answer": 1, "score": 0.8, "why": "..."}, ...]}`; fenced or surrounded by prose is accepted.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)

SYSTEM_PROMPT = (
    "You are a strict, fair judge. You are given a task, a rubric and several answers to the same task, written "
    "independently. Score each answer from 0.0 (worst) to 1.0 (best) by the rubric, comparing the answers with "
    "each other: a better answer gets a higher score, equally good answers get equal scores. Reply with JSON only, "
    'in this shape: {"scores": [{"answer": 1, "score": 0.5, "why": "one short sentence"}, ...]}, one entry per '
    "answer, every answer once."
)


class JudgeReplyError(ValueError):
    """The judge's reply is not one score in [0, 1] per answer; the message says what was wrong."""


@dataclass(frozen=True)
class Score:
    value: float
    why: str = ""


def final_answer(response_jsons: Iterable[str]) -> str:
    """The answer of a rollout: the assistant's text in the last recorded response that has any (its content, and
    any tool calls it made written as `name(arguments)`). "" when no call answered."""
    answer = ""
    for text in response_jsons:
        try:
            response = json.loads(text) if text else None
        except ValueError:
            continue
        choices = response.get("choices") if isinstance(response, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts = [str(content)] if content else []
            for call in message.get("tool_calls") or []:
                function = call.get("function", {}) if isinstance(call, dict) else {}
                parts.append(f"[tool call {function.get('name', '')}({function.get('arguments', '')})]")
            found = "\n".join(parts)
        else:
            found = str(first.get("text") or "")
        if found.strip():
            answer = found
    return answer


def task_text(task_json: str) -> str:
    """The task as the judge reads it: the input's JSON, re-serialised with sorted keys (so that the cache key does
    not depend on key order); text that is not JSON as it is."""
    try:
        return json.dumps(json.loads(task_json), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return task_json


def render_messages(rubric: str, task: str, answers: Sequence[str], max_answer_chars: int) -> list[dict[str, str]]:
    """The chat messages that ask for the scores of `answers` (numbered from 1) to `task` by `rubric`. An answer
    longer than max_answer_chars is cut, and the cut is said."""
    blocks = []
    for number, answer in enumerate(answers, 1):
        text = answer if answer.strip() else "(no answer: the agent produced no text)"
        if len(text) > max_answer_chars:
            text = f"{text[:max_answer_chars]}\n[... cut: {len(answer) - max_answer_chars} more characters]"
        blocks.append(f"### Answer {number}\n{text}")
    user = (
        f"## Rubric\n{rubric.strip()}\n\n## Task\n{task}\n\n## Answers ({len(answers)})\n\n"
        + "\n\n".join(blocks)
        + f'\n\nReply with the JSON object {{"scores": [...]}} holding {len(answers)} entries, answers 1 to '
        f"{len(answers)}."
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _json_object(reply: str) -> Any:
    candidates = [m.group(1) for m in _FENCE.finditer(reply)]
    start, end = reply.find("{"), reply.rfind("}")
    if start != -1 and end > start:
        candidates.append(reply[start : end + 1])
    for text in candidates:
        try:
            return json.loads(text)
        except ValueError:
            continue
    raise JudgeReplyError(f"no JSON object in the judge's reply: {_excerpt(reply)}")


def _excerpt(text: str, most: int = 200) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= most else flat[:most] + "...")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JudgeReplyError(f"{where}: the score {value!r} is not a number")
    score = float(value)
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise JudgeReplyError(f"{where}: the score {value!r} is outside [0, 1]")
    return score


def parse_scores(reply: str, count: int) -> list[Score]:
    """The scores of answers 1..count from the judge's reply (JudgeReplyError when it is not exactly that)."""
    found = _json_object(reply)
    entries = found.get("scores") if isinstance(found, Mapping) else None
    if not isinstance(entries, list):
        raise JudgeReplyError(f'the judge\'s reply has no "scores" list: {_excerpt(reply)}')
    if len(entries) != count:
        raise JudgeReplyError(f"the judge scored {len(entries)} answers, not {count}: {_excerpt(reply)}")
    scores: dict[int, Score] = {}
    for position, entry in enumerate(entries, 1):
        if isinstance(entry, Mapping):
            number = entry.get("answer", position)
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
                raise JudgeReplyError(f"scores[{position - 1}]: answer {number!r} is not one of 1..{count}")
            if number in scores:
                raise JudgeReplyError(f"scores[{position - 1}]: answer {number} is scored twice")
            why = entry.get("why", "")
            scores[number] = Score(_number(entry.get("score"), f"answer {number}"), str(why) if why else "")
        else:
            scores[position] = Score(_number(entry, f"answer {position}"))
    return [scores[number] for number in range(1, count + 1)]


def cache_key(rubric: str, task: str, answer: str, model: str) -> str:
    """What a score is remembered by: the rubric, the task, the answer and the judge's model (sha256, hex)."""
    digest = hashlib.sha256()
    for part in (rubric, task, answer, model):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


@dataclass
class JudgeCost:
    """What judging cost since the last `metrics()`: calls made, their tokens, and answers scored without one."""

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    judged_rollouts: int = 0
    kept_agent_rewards: int = 0
    failed_groups: int = 0
    left_out_rollouts: int = 0

    def metrics(self, prefix: str = "agl/judge") -> dict[str, float]:
        """The counts as `agl/judge/<name>` metrics (all of them, zeros included)."""
        return {f"{prefix}/{name}": float(value) for name, value in vars(self).items()}
