"""Attempts through the whole stack (compose services as processes): the math agent's first attempt is killed from
outside, the rollout's retry policy starts attempt 2, and the trainer's terminal feed sees the rollout once, with
attempt 2's calls only. The flaky agent lives here so the stack's controller can import it like any agent class."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path

from examples.math_agent.agent import MathAgent
from services._gen.agl.v1 import rollout_pb2
from services.trainer.rollouts.feed import TerminalFeed
from services.trainer.rollouts.specs import LABEL_RUN
from services.trainer.rollouts.state import ManagerState
from tests.e2e.conftest import TASK_ENV, Stack, spec

SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED


class FirstAttemptHangsAgent:
    """The math agent, except that its first attempt (no pid file yet) makes its model call, writes its pid and
    hangs, as a pod on a node about to fail would."""

    def run(self) -> float:
        pid_file = Path(os.environ["AGL_TASK_PIDFILE"])
        if not pid_file.exists():
            from openai import OpenAI

            client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0)
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "first try"}], max_tokens=4
            )
            # Written whole, then renamed: the test polls for the file and reads it at once, and write_text creates
            # it empty before writing (a full CI run read '' there once, at a load of ~6 on 2 cores).
            partial = pid_file.with_name(pid_file.name + ".partial")
            partial.write_text(json.dumps({"pid": os.getpid()}))
            os.replace(partial, pid_file)
            time.sleep(300)
        return MathAgent().run()


async def test_a_killed_first_attempt_is_retried_and_the_trainer_sees_attempt_two_once(
    stack: Stack, tmp_path: Path
) -> None:
    run = f"retry-{uuid.uuid4().hex[:8]}"
    pid_file = tmp_path / "first.pid"
    task = {"question": "What is 12 + 7?", "answer": "19", "pid_file": str(pid_file)}
    created = spec(
        run,
        "r0",
        task,
        agent_class="tests.e2e.test_attempts_e2e:FirstAttemptHangsAgent",
        env_map={**TASK_ENV, "AGL_TASK_PIDFILE": "input.pid_file"},
    )
    created.metadata.labels[LABEL_RUN] = run
    created.config.retry.CopyFrom(rollout_pb2.RetryPolicy(max_attempts=2, initial_backoff_seconds=0.2))
    async with stack.client() as client:
        feed = TerminalFeed(client, run, ManagerState())
        feed.start()
        try:
            await client.create_rollouts([created])
            deadline = time.monotonic() + 60
            while not pid_file.exists():
                assert time.monotonic() < deadline, f"the first attempt never started\n{stack.logs()}"
                await asyncio.sleep(0.05)
            os.kill(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
            await asyncio.wait_for(feed.changed.wait(), 90)
            await asyncio.sleep(1.0)  # nothing else arrives for it
            feed.check()
            assert feed.received == 1 and feed.duplicates_skipped == 0
            [entry] = feed.take([created.rollout_id])
        finally:
            await feed.stop()
        status = entry.rollout.status
        assert status.state == SUCCEEDED, (status.error_message, stack.logs())
        first, second = status.attempts
        assert first.failure_reason == rollout_pb2.FAILURE_REASON_KILLED and "SIGKILL" in first.error_message
        assert status.attempt_id == second.attempt_id
        # The trainer's batch: attempt 2's call and reward only, in the triplet view.
        assert {e.attempt_id for e in entry.events} == {second.attempt_id}
        assert [e.event_type for e in entry.events] == ["model_request", "reward"]
        assert entry.events[-1].reward.value == 1.0
        # Attempt 1's call is kept under its own attempt.
        everything = await client.list_events(created.rollout_id, attempt_id="*")
        assert [(e.attempt_id, e.event_type) for e in everything] == [
            (first.attempt_id, "model_request"),
            (second.attempt_id, "model_request"),
            (second.attempt_id, "reward"),
        ]
        await client.delete_rollouts([created.rollout_id])
