"""The judge in the rollout manager, against the real ledger and a stand-in judge endpoint speaking OpenAI's
chat-completions wire shape (tests/support/judge_server.py); a test driver plays controller + agent, recording each
model call with the chat completion the agent got, as the proxy records it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from services._gen.agl.v1 import event_pb2, model_pb2
from services.client import LedgerClient
from services.trainer.config import ConfigError, judge_settings
from services.trainer.data import step_health as h
from services.trainer.data.guardrails import DEFAULT_LIMITS, Guardrails, HealthStop, judge_failed_line
from services.trainer.judge.group_judge import (
    RECORD_EVENT_TYPE,
    REWARD_EVENT_ID,
    SOURCE,
    GroupJudge,
    JudgeSettings,
    Member,
)
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager, StepResult
from services.trainer.rollouts.specs import LaunchSettings, Sample
from tests.support.judge_server import JudgeServer, serve_judge
from tests.support.procs import ServiceProcess

from .driver import FAILED, RUNNING, SUCCEEDED, wait_rollouts

RUBRIC = "Score 1 for the capital of the country asked about, 0 otherwise."
LAUNCH = LaunchSettings(timeout_seconds=30, agent_class="examples.math_agent:Agent")


def judge_settings_for(tmp_path: Path, **kw) -> JudgeSettings:
    base = {"rubric_file": str(tmp_path / "rubric.txt"), "rubric": RUBRIC, "attempts": 2, "timeout_s": 5.0}
    base.update(kw)
    return JudgeSettings(**base)


def manager_for(client: LedgerClient, run_id: str, tmp_path: Path, judge: GroupJudge, n: int = 3) -> RolloutManager:
    settings = ManagerSettings(
        run_id=run_id, n=n, train_batch_size=2, launch=LAUNCH, state_path=tmp_path / f"{run_id}.json",
        progress=False, flush_interval_s=0.05, keep_steps=-1,
    )  # fmt: skip
    return RolloutManager(client, settings, judge=judge)


async def answer(
    client: LedgerClient, rollout_id: str, text: str, reward: float | None = None, ok: bool = True
) -> None:
    """The rollout runs, makes one model call answered `text`, posts `reward` (None: none) and ends."""
    await client.update_status(rollout_id, RUNNING, attempt_id="a1", controller_id="test-driver")
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    request = event_pb2.ModelRequest(
        prompt_token_ids=[1, 2], response_token_ids=[3, 4], response_logprobs=[-0.5, -0.5], has_response_logprobs=True,
        status=event_pb2.MODEL_REQUEST_STATUS_OK, response_json=json.dumps(response),
        request_json=json.dumps({"messages": [{"role": "user", "content": "?"}]}),
    )  # fmt: skip
    events = [event_pb2.Event(rollout_id=rollout_id, event_type="model_request", model_request=request)]
    if reward is not None:
        events.append(
            event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=reward))
        )
    await client.append_events(events)
    await client.update_status(rollout_id, SUCCEEDED if ok else FAILED, error_message="" if ok else "exit code 1")


async def run_step(
    manager: RolloutManager, client: LedgerClient, run_id: str, step: int, tasks: Sequence[Sample],
    answers: dict[int, list[tuple[str, float | None]]],
) -> StepResult:  # fmt: skip
    """One step of two groups; answers[slot] = (text, agent reward) per rollout of that group."""
    task = asyncio.create_task(manager.collect(step, iter(tasks)))
    await wait_rollouts(client, run_id, sum(len(a) for a in answers.values()) * step)
    for slot, group in answers.items():
        for i, (text, reward) in enumerate(group):
            await answer(client, f"{run_id}-s{step}-g{slot}-r{i}", text, reward)
    return await asyncio.wait_for(task, 20)


async def judge_events(client: LedgerClient, rollout_id: str) -> tuple[list[dict], list[event_pb2.Event]]:
    events = await client.list_events(rollout_id)
    records = [json.loads(e.data_json) for e in events if e.event_type == RECORD_EVENT_TYPE]
    rewards = [e for e in events if e.event_type == "reward" and e.reward.source == SOURCE]
    return records, rewards


FRANCE = Sample("france", {"question": "What is the capital of France?"})
ITALY = Sample("italy", {"question": "What is the capital of Italy?"})


async def test_the_judge_scores_each_group_side_by_side_records_what_it_said_and_caches_the_scores(
    ledger: ServiceProcess, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = LedgerClient(ledger.address)
    with serve_judge() as server:
        settings = judge_settings_for(
            tmp_path, base_url=server.url, model="judge-large", api_key="sk-judge", cache_path=tmp_path / "cache.jsonl"
        )
        judge = GroupJudge(settings, client, policy_model="agl-policy")
        manager = manager_for(client, run_id, tmp_path, judge)
        await manager.start()
        try:
            answers = {0: [("Paris", None), ("Lyon", None), ("Marseille", 0.3)], 1: [("Rome", None)] * 3}
            first = await run_step(manager, client, run_id, 1, [FRANCE, ITALY], answers)
            calls_after_first = len(server.requests)
            # The same tasks and answers again: every score comes from the cache, no call is made.
            second = await run_step(manager, client, run_id, 2, [FRANCE, ITALY], answers)
        finally:
            await manager.close()
    rewards = {t.rollout_id: t.reward for t in first.traces}
    g0, g1 = f"{run_id}-s1-g0", f"{run_id}-s1-g1"
    # scope "missing": the agent's own reward (0.3) stands; the judge scores the two without one.
    assert rewards == {f"{g0}-r0": 1.0, f"{g0}-r1": 0.0, f"{g0}-r2": 0.3, f"{g1}-r0": 0.0, f"{g1}-r1": 0.0,
                       f"{g1}-r2": 0.0}  # fmt: skip
    assert not any(t.reward_missing for t in first.traces)
    # One call per group; group 1's three equal answers are shown (and paid for) once.
    assert calls_after_first == 2
    bodies = {json.dumps(r["body"]["messages"]): r for r in server.requests}
    assert all(r["path"] == "/v1/chat/completions" for r in server.requests)
    assert {r["headers"]["Authorization"] for r in server.requests} == {"Bearer sk-judge"}
    assert {r["body"]["model"] for r in server.requests} == {"judge-large"}
    assert {r["body"]["temperature"] for r in server.requests} == {0.0}
    france = next(json.loads(b) for b in bodies if "France" in b)[1]["content"]
    assert "### Answer 1\nParis" in france and "### Answer 2\nLyon" in france and "Marseille" not in france
    assert RUBRIC in france
    italy = next(json.loads(b) for b in bodies if "Italy" in b)[1]["content"]
    assert italy.count("### Answer") == 1
    metrics = first.metrics
    assert metrics["agl/judge/calls"] == 2 and metrics["agl/judge/judged_rollouts"] == 5
    assert metrics["agl/judge/kept_agent_rewards"] == 1 and metrics["agl/judge/cache_hits"] == 0
    assert metrics["agl/judge/prompt_tokens"] > 50 and metrics["agl/judge/completion_tokens"] > 5
    assert metrics["agl/judge/failed_groups"] == 0 and metrics["agl/rollout/hook_events"] == 0
    # What the judge saw and said is in the ledger, beside its reward (durable, with stable ids).
    records, judged = await judge_events(client, f"{g0}-r0")
    assert [e.reward.value for e in judged] == [1.0] and judged[0].event_id == REWARD_EVENT_ID
    assert judged[0].reward.reason == "answer 1 judged by the rule"
    (record,) = records
    assert record["score"] == 1.0 and record["answer_number"] == 1 and not record["cached"]
    assert record["judge_model"] == "judge-large" and record["rubric_file"].endswith("rubric.txt")
    assert '"score": 1.0' in record["reply"] and record["messages"][1]["content"] == france
    assert record["prompt_tokens"] > 50
    assert await judge_events(client, f"{g0}-r2") == ([], [])  # the agent's reward was kept, no judge event
    # Step 2: no new call, every judged answer a cache hit, the same scores; "sk-judge" appears in no event.
    assert len(server.requests) == calls_after_first
    assert second.metrics["agl/judge/calls"] == 0 and second.metrics["agl/judge/cache_hits"] == 5
    assert [t.reward for t in second.traces] == [t.reward for t in first.traces]
    records, _ = await judge_events(client, f"{run_id}-s2-g0-r1")
    assert records[0]["cached"] and records[0]["score"] == 0.0 and "reply" not in records[0]
    # The request and reply are kept once per group: the group's other judged rollouts name where.
    records, _ = await judge_events(client, f"{g0}-r1")
    assert records[0]["call_on"] == f"{g0}-r0" and "reply" not in records[0] and records[0]["score"] == 0.0
    every = [e for t in first.traces for e in await client.list_events(t.rollout_id)]
    assert not any("sk-judge" in e.data_json for e in every)
    # A trainer started again over the same cache file asks nothing either.
    again = GroupJudge(settings, client, policy_model="agl-policy")
    assert len(again.cache) == 3
    await client.close()


async def test_a_group_the_judge_cannot_score_is_left_out_named_and_counted_never_trained_as_zeros(
    ledger: ServiceProcess, run_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = LedgerClient(ledger.address)
    down = Sample("down", {"question": "judge-down: what is the capital of Spain?"})
    rambles = Sample("rambles", {"question": "judge-rambles: what is the capital of Peru?"})
    with serve_judge() as server:
        judge = GroupJudge(judge_settings_for(tmp_path, base_url=server.url, model="j"), client, policy_model="p")
        manager = manager_for(client, run_id, tmp_path, judge, n=2)
        await manager.start()
        try:
            answers = {0: [("Madrid", None), ("Paris", None)], 1: [("Lima", None), ("Cusco", None)]}
            result = await run_step(manager, client, run_id, 1, [down, rambles], answers)
        finally:
            await manager.close()
    assert result.traces == []  # both groups out: nothing trains on a fill value
    by_group = {f.group_id: f for f in result.judge_failures}
    g0, g1 = f"{run_id}-s1-g0", f"{run_id}-s1-g1"
    assert by_group[g0].rollout_ids == [f"{g0}-r0", f"{g0}-r1"]
    assert "HTTP 503" in by_group[g0].reason and "the judge is overloaded" in by_group[g0].reason
    assert "judge failed after 2 attempt(s): no JSON object in the judge's reply" in by_group[g1].reason
    assert len(server.requests) == 4  # each group tried twice
    m = result.metrics
    assert m["agl/judge/failed_groups"] == 2 and m["agl/judge/left_out_rollouts"] == 4
    assert m["agl/judge/failed_calls"] == 4 and m["agl/judge/calls"] == 2  # the rambling replies were calls
    assert any(f"group {g0} left out of the step" in r.message and f"{g0}-r1" in r.message for r in caplog.records)
    assert (await judge_events(client, f"{g0}-r0")) == ([], [])
    # The step's guardrails: every group failed -> the run stops with one line naming the first.
    failed = [(f.group_id, f.rollout_ids, f.reason) for f in result.judge_failures]
    line = judge_failed_line(1, failed, len(result.group_ids))
    assert line is not None and line.startswith(f"step 1: the judge scored no group (2 of 2 failed); first: group {g0}")
    assert judge_failed_line(1, failed[:1], 2) is None
    await client.close()


def test_some_groups_failing_warns_and_past_the_stop_limit_stops_the_run() -> None:
    failed = [(f"g{i}", [f"g{i}-r0"]) for i in range(5)]
    guard = Guardrails(DEFAULT_LIMITS, min_count=8)
    assert guard.enforce(3, h.judge_health(failed[:1], 10), h.JUDGE_NAMES) == 1  # above 0: a warning
    with pytest.raises(HealthStop, match=r"step 3: agl/health/judge_failed_groups=0\.6 \(6 of 10\) over the stop"):
        guard.enforce(3, h.judge_health([*failed, ("g5", ["g5-r0"])], 10), h.JUDGE_NAMES)
    assert h.judge_health([], 4).metrics() == {"agl/health/judge_failed_groups": 0.0}


async def test_the_policy_judges_on_the_engine_registered_under_the_runs_model_and_nothing_is_judged_twice(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    policy = f"{run_id}-policy"
    with serve_judge(JudgeServer(score=lambda a: 0.5 if "Rome" in a else 0.0)) as engine:
        await client.register_models([model_pb2.ModelEndpoint(model_name=policy, endpoint=engine.url, version=3)])
        judge = GroupJudge(judge_settings_for(tmp_path), client, policy_model=policy, engine_key="engine-key")
        manager = manager_for(client, run_id, tmp_path, judge, n=2)
        await manager.start()
        try:
            answers = {0: [("Rome", None), ("Milan", None)], 1: [("Paris", 1.0), ("Lyon", 0.0)]}
            result = await run_step(manager, client, run_id, 1, [ITALY, FRANCE], answers)
        finally:
            await manager.close()
        (request,) = engine.requests  # group 1 had its agent's rewards: no call
        assert request["body"]["model"] == policy and request["headers"]["Authorization"] == "Bearer engine-key"
        assert {t.rollout_id: t.reward for t in result.traces if "g0" in t.rollout_id} == {
            f"{run_id}-s1-g0-r0": 0.5, f"{run_id}-s1-g0-r1": 0.0
        }  # fmt: skip
        # A restarted trainer consuming the same rollouts again sees the judge's reward in their events (the
        # terminal feed's view) and asks nothing; nor is a failed rollout ever judged.
        rollout = await client.get_rollout(f"{run_id}-s1-g0-r0")
        seen = await client.list_events(rollout.rollout_id, view=event_pb2.EVENT_VIEW_TRIPLET)
        fresh = GroupJudge(judge_settings_for(tmp_path), client, policy_model=policy)
        verdict = await fresh.judge("g", [Member(rollout, seen, True), Member(rollout, [], False)])
        assert verdict.events == [] and not verdict.failure and len(engine.requests) == 1
    await client.delete_models([model_pb2.ModelEndpointKey(model_name=policy, endpoint=engine.url)])
    await client.close()


def test_agl_judge_settings_read_the_rubric_and_key_and_refuse_what_cannot_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubric = tmp_path / "rubric.txt"
    rubric.write_text(RUBRIC)
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-123")

    def read(**judge):
        return judge_settings(OmegaConf.create({"judge": judge}), "run1", tmp_path)

    assert read() is None and read(rubric=None, scope="all") is None
    found = read(rubric=str(rubric), url="https://judge.example/v1", model="m", key_env="JUDGE_TEST_KEY", scope="all")
    assert found.rubric == RUBRIC and found.api_key == "sk-123" and found.scope == "all"
    assert found.cache_path == tmp_path / "run1.judge-cache.jsonl" and "sk-123" not in repr(found)
    policy = read(rubric=str(rubric))
    assert policy.base_url is None and policy.model == "" and policy.attempts == 2
    refused = {
        "agl.judge.url applies to a judge: set agl.judge.rubric": {"url": "http://x/v1"},
        "agl.judge.rubric=/nowhere.txt: cannot be read": {"rubric": "/nowhere.txt"},
        "agl.judge.url needs agl.judge.model": {"rubric": str(rubric), "url": "http://x/v1"},
        "agl.judge.model applies to an external judge": {"rubric": str(rubric), "model": "m"},
        "agl.judge.key_env applies to an external judge": {"rubric": str(rubric), "key_env": "JUDGE_TEST_KEY"},
        "agl.judge.url=ftp://x: an http:// or https://": {"rubric": str(rubric), "url": "ftp://x", "model": "m"},
        "agl.judge.key_env=NO_SUCH_VAR_X: the environment has no NO_SUCH_VAR_X": {
            "rubric": str(rubric), "url": "http://x/v1", "model": "m", "key_env": "NO_SUCH_VAR_X"
        },
        "agl.judge.scope=some: `missing`": {"rubric": str(rubric), "scope": "some"},
        "agl.judge.attempts=0: an integer >= 1": {"rubric": str(rubric), "attempts": 0},
        "agl.judge.colour: unknown key": {"rubric": str(rubric), "colour": "red"},
    }  # fmt: skip
    for says, judge in refused.items():
        with pytest.raises(ConfigError) as err:
            read(**judge)
        assert str(err.value).startswith(says), (says, str(err.value))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ConfigError, match="the rubric file is empty"):
        read(rubric=str(tmp_path / "empty.txt"))
