"""A reward the agent returns instead of posting (run() returns a number) reaches the trainer (real controller, ledger,
proxy; warm and fresh launches): posted by the controller before the attempt is reported succeeded, unless the agent
posted one itself; a returned bool or text is no reward."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from tests.controller.conftest import Stack, run_controller, spec, wait_for

AGENTS = "tests.controller.agents.returning"
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED


def rewards(events: list[event_pb2.Event]) -> list[dict]:
    return [{"value": e.reward.value, "source": e.reward.source} for e in events if e.event_type == "reward"]


@pytest.mark.parametrize("launch", ["warm", "fresh"])
async def test_a_returned_number_is_the_reward_unless_the_agent_posted_one(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, launch: str
) -> None:
    run_label = {"agl-launch": launch, "test-run": uuid.uuid4().hex[:8]}
    cases = {
        "returns": ("ReturnsReward", [0.75]),
        "posts-and-returns": ("PostsAndReturns", [1.0]),
        "returns-true": ("ReturnsTrue", []),
        "returns-text": ("ReturnsText", []),
    }
    specs = {
        name: spec(agent_class=f"{AGENTS}:{cls}", labels=run_label, rollout_id=f"ro-{name}-{launch}")
        for name, (cls, _) in cases.items()
    }
    with run_controller(stack, tmp_path) as controller:
        await ledger.create_rollouts(list(specs.values()))
        done = await wait_for(ledger, [s.rollout_id for s in specs.values()])
        log = controller.process.log_text()

    # What the trainer's terminal feed carries with each rollout, and the triplet view.
    terminal = await ledger.list_terminal(labels=run_label, include_events=True)
    fed = {entry.rollout.rollout_id: rewards(list(entry.events)) for entry in terminal.entries}
    for name, (_, expected) in cases.items():
        rollout_id = specs[name].rollout_id
        assert done[rollout_id].status.state == SUCCEEDED, (name, done[rollout_id].status.error_message)
        triplet = rewards(await ledger.list_events(rollout_id, view=event_pb2.EVENT_VIEW_TRIPLET))
        assert [r["value"] for r in triplet] == expected, (name, triplet)
        assert [r["value"] for r in fed[rollout_id]] == expected, (name, fed[rollout_id])
        full = await ledger.list_events(rollout_id, event_type="reward")
        assert all(e.attempt_id == done[rollout_id].status.attempt_id for e in full), name

    [returned] = rewards(await ledger.list_events(specs["returns"].rollout_id, event_type="reward"))
    assert returned == {"value": 0.75, "source": "returned"}
    [posted] = rewards(await ledger.list_events(specs["posts-and-returns"].rollout_id, event_type="reward"))
    assert posted["source"] == "posted"
    assert "posted the reward 0.75 run() returned" in log, log
    assert list(tmp_path.rglob("*.returned")) == []  # the controller took every file the agents wrote
