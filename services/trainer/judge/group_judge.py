"""One finished GRPO group to the judge's reward events.

Guarantees:
- The judge's reward is an ordinary `reward` event of the rollout's attempt (source `agl-judge`, the judge's reason)
  with the stable id `agl-judge-reward`, appended by the rollout manager with the hooks' events: it is durable, it is
  the reward the trainer reads (the last one), and a rollout that already has it (a restarted trainer consuming it
  again) is never judged twice. Beside it an `agl_judge` event (id `agl-judge-call`) records what the judge saw and
  said: the model, the rubric's file and hash, the score and why, whether it came from the cache, and (on the
  group's first judged rollout; `call_on` names it on the others) the prompt, the reply and the call's tokens.
  The judge's call goes straight to its endpoint, never through the proxy: it is no model call of any rollout, so
  it is never trained.
- Which rollouts it scores (`scope`): `missing` (the default) only the succeeded rollouts whose agent posted no
  reward, the agent's own reward standing where there is one; `all` every succeeded rollout, the judge's reward
  counting over the agent's. Failed rollouts are never judged: the agent's failure is its score, or the
  infrastructure's failure leaves it out (data/infra_policy.py).
- A group is judged in one call, its distinct answers numbered side by side; a step's groups at once, at most
  MAX_CONCURRENT_CALLS requests in flight. An answer already scored (same rubric,
  task, answer and judge model: cache.py) keeps its score; when every answer of a group is known no call is made.
- A failure (the endpoint unreachable or erring, a reply that is no score per answer) is retried `attempts` times in
  all; after that the group gets no reward from the judge and the verdict says why (the manager leaves the group out
  of the step and counts it; never a silent 0).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, LedgerError, RetryPolicy
from services.trainer.judge import endpoint, scoring
from services.trainer.judge.cache import ScoreCache

log = logging.getLogger(__name__)

SCOPE_MISSING = "missing"
SCOPE_ALL = "all"
SCOPES = (SCOPE_MISSING, SCOPE_ALL)
REWARD_EVENT_ID = "agl-judge-reward"
RECORD_EVENT_ID = "agl-judge-call"
RECORD_EVENT_TYPE = "agl_judge"
SOURCE = "agl-judge"
_REASON_CHARS = 500
MAX_CONCURRENT_CALLS = 8


@dataclass(frozen=True)
class JudgeSettings:
    """agl.judge (services/trainer/config.py reads it)."""

    rubric_file: str
    rubric: str
    # An OpenAI-compatible base URL (ending in /v1); None: the run's own policy, on the engines registered under the
    # run's model name.
    base_url: str | None = None
    # The judge's model name at base_url ("" with the policy: the run's model name).
    model: str = ""
    # The environment variable the endpoint's key was read from (named in the run's config, never the key itself).
    key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    scope: str = SCOPE_MISSING
    max_tokens: int = 1024
    timeout_s: float = 60.0
    # Calls per group before it is given up (1: no retry).
    attempts: int = 2
    max_answer_chars: int = 4000
    # The cache's file (cache.py); None: in memory only.
    cache_path: Path | None = None


@dataclass(frozen=True)
class Member:
    """A consumed rollout of the group: its events as the manager has them (the triplet view plus the hooks')."""

    rollout: rollout_pb2.Rollout
    events: Sequence[event_pb2.Event]
    succeeded: bool


@dataclass(frozen=True)
class JudgeFailure:
    """A group the judge could not score, left out of its step."""

    group_id: str
    rollout_ids: list[str]
    reason: str


@dataclass
class Verdict:
    events: list[event_pb2.Event] = field(default_factory=list)
    # Why the group got no reward from the judge; "" when it did (or needed none).
    failure: str = ""


def _has_reward(events: Sequence[event_pb2.Event], judge: bool) -> bool:
    return any(
        e.event_type == "reward" and e.reward.HasField("value") and (e.event_id == REWARD_EVENT_ID) == judge
        for e in events
    )


class GroupJudge:
    def __init__(
        self,
        settings: JudgeSettings,
        ledger: LedgerClient,
        *,
        policy_model: str,
        engine_key: str | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.model = settings.model or policy_model
        self.policy_model = policy_model
        self.api_key = settings.api_key if settings.base_url else engine_key
        self.cache = ScoreCache(settings.cache_path)
        self.cost = scoring.JudgeCost()
        self.rubric_sha256 = hashlib.sha256(settings.rubric.encode()).hexdigest()
        self._http: httpx.AsyncClient | None = None
        # A step's groups are judged at once; at most this many requests are in flight (an endpoint's rate limit).
        self._calls = asyncio.Semaphore(MAX_CONCURRENT_CALLS)

    def take_cost(self) -> scoring.JudgeCost:
        """The cost since the last take (one step's)."""
        cost, self.cost = self.cost, scoring.JudgeCost()
        return cost

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _base_url(self) -> str:
        if self.settings.base_url:
            return self.settings.base_url
        try:
            registered = await self.ledger.list_models(self.policy_model)
        except LedgerError as err:
            raise endpoint.JudgeEndpointError(f"listing the engines of {self.policy_model} failed: {err}") from None
        if not registered:
            raise endpoint.JudgeEndpointError(f"no engine is registered under the model {self.policy_model}")
        newest = max(registered, key=lambda e: (e.version, e.endpoint))
        return newest.endpoint

    async def _answer(self, rollout: rollout_pb2.Rollout) -> str:
        calls = await self.ledger.list_events(
            rollout.rollout_id, attempt_id=rollout.status.attempt_id, event_type="model_request"
        )
        return scoring.final_answer(
            e.model_request.response_json
            for e in calls
            if e.model_request.status in (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED)
        )

    async def judge(self, group_id: str, members: Sequence[Member]) -> Verdict:
        """The reward events for the group's rollouts that need the judge's score (see the module's guarantees)."""
        targets: list[rollout_pb2.Rollout] = []
        for member in members:
            if not member.succeeded or _has_reward(member.events, judge=True):
                continue
            if self.settings.scope == SCOPE_MISSING and _has_reward(member.events, judge=False):
                self.cost.kept_agent_rewards += 1
                continue
            targets.append(member.rollout)
        if not targets:
            return Verdict()
        try:
            answers = list(await asyncio.gather(*(self._answer(r) for r in targets)))
        except LedgerError as err:
            return Verdict(failure=f"reading the answers failed: {err}")
        task = scoring.task_text(targets[0].input_json)
        keys = [scoring.cache_key(self.settings.rubric, task, a, self.model) for a in answers]
        distinct = list(dict.fromkeys(keys))
        shown = {key: answers[keys.index(key)] for key in distinct}
        known = {key: score for key in distinct if (score := self.cache.get(key)) is not None}
        scored = dict(known)
        call: dict[str, object] = {}
        if len(known) < len(distinct):
            messages = scoring.render_messages(
                self.settings.rubric, task, list(shown.values()), self.settings.max_answer_chars
            )
            async with self._calls:
                found = await self._scores(group_id, messages, len(distinct))
            if isinstance(found, str):
                return Verdict(failure=found)
            scores, reply = found
            fresh = {key: score for key, score in zip(distinct, scores, strict=True) if key not in known}
            self.cache.put(fresh)
            scored.update(fresh)
            call = {"messages": messages, "reply": reply.text, "model": reply.model,
                    "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}  # fmt: skip
        self.cost.cache_hits += sum(1 for key in keys if key in known)
        self.cost.judged_rollouts += len(targets)
        events: list[event_pb2.Event] = []
        for rollout, key in zip(targets, keys, strict=True):
            number = distinct.index(key) + 1
            events.extend(self._events(group_id, rollout, scored[key], number, key in known, call))
            if call and key not in known:  # the request and the reply once per group, on its first judged rollout
                call = {"call_on": rollout.rollout_id}
        return Verdict(events=events)

    async def _scores(
        self, group_id: str, messages: list[dict[str, str]], count: int
    ) -> tuple[list[scoring.Score], endpoint.JudgeReply] | str:
        """The judge's scores and its reply, or why there are none after every attempt."""
        if self._http is None:
            self._http = httpx.AsyncClient()
        problem = ""
        retry = RetryPolicy(attempts=self.settings.attempts, initial_backoff_s=0.2)  # AGL's one backoff, full jitter
        for attempt in range(1, self.settings.attempts + 1):
            try:
                base_url = await self._base_url()
                reply = await endpoint.chat(
                    self._http, base_url, self.model, messages, api_key=self.api_key,
                    max_tokens=self.settings.max_tokens, timeout_s=self.settings.timeout_s,
                )  # fmt: skip
            except endpoint.JudgeEndpointError as err:
                problem = str(err)
            else:
                self.cost.calls += 1
                self.cost.prompt_tokens += reply.prompt_tokens
                self.cost.completion_tokens += reply.completion_tokens
                try:
                    return scoring.parse_scores(reply.text, count), reply
                except scoring.JudgeReplyError as err:
                    problem = str(err)
            self.cost.failed_calls += 1
            log.warning(
                "group %s: judge attempt %d of %d failed: %s", group_id, attempt, self.settings.attempts, problem
            )
            if attempt < self.settings.attempts:
                await asyncio.sleep(retry.backoff(attempt))
        return f"judge failed after {self.settings.attempts} attempt(s): {problem}"

    def _events(
        self, group_id: str, rollout: rollout_pb2.Rollout, score: scoring.Score, number: int, cached: bool,
        call: dict[str, object],
    ) -> list[event_pb2.Event]:  # fmt: skip
        attempt = rollout.status.attempt_id
        record = {
            "group_id": group_id,
            "judge_model": self.model,
            "endpoint": self.settings.base_url or f"the policy's engine ({self.policy_model})",
            "rubric_file": self.settings.rubric_file,
            "rubric_sha256": self.rubric_sha256,
            "scope": self.settings.scope,
            "answer_number": number,
            "score": score.value,
            "why": score.why,
            "cached": cached,
            **({} if cached else call),
        }
        reward = event_pb2.Reward(value=score.value, source=SOURCE, reason=score.why[:_REASON_CHARS])
        # The reward first: a rollout that has it is never judged again, so its record can only be missing, never
        # appended twice with other content.
        return [
            event_pb2.Event(
                rollout_id=rollout.rollout_id, attempt_id=attempt, event_id=REWARD_EVENT_ID, event_type="reward",
                reward=reward,
            ),
            event_pb2.Event(
                rollout_id=rollout.rollout_id, attempt_id=attempt, event_id=RECORD_EVENT_ID,
                event_type=RECORD_EVENT_TYPE, data_json=json.dumps(record, ensure_ascii=False),
            ),
        ]  # fmt: skip


async def judge_groups(
    judge: GroupJudge, groups: Mapping[str, Sequence[Member]]
) -> tuple[dict[str, list[event_pb2.Event]], list[JudgeFailure]]:
    """Judges the groups at once: the judge's events by rollout id, and the groups it could not score (counted in
    its cost and named, with their rollouts, in one log line each)."""
    verdicts = await asyncio.gather(*(judge.judge(group_id, members) for group_id, members in groups.items()))
    events: dict[str, list[event_pb2.Event]] = {}
    failures: list[JudgeFailure] = []
    for (group_id, members), verdict in zip(groups.items(), verdicts, strict=True):
        if verdict.failure:
            ids = [member.rollout.rollout_id for member in members]
            judge.cost.failed_groups += 1
            judge.cost.left_out_rollouts += len(ids)
            log.warning("group %s left out of the step: %s; rollouts: %s", group_id, verdict.failure, ", ".join(ids))
            failures.append(JudgeFailure(group_id, ids, verdict.failure))
            continue
        for event in verdict.events:
            events.setdefault(event.rollout_id, []).append(event)
    return events, failures
