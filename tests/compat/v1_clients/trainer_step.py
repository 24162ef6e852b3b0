"""One training step's HTTP traffic as v1.0's trainer sends it (agentlightning.verl.agl_rollout_manager, unmodified):
register the engine, enqueue a batch with pre-assigned ids and wait for it (the sync trainer's loop), enqueue another
and follow the terminal cursor (`/api/rollouts/terminal`, read with v1.0's own page model), turn both into v1.0's
CompletedRollout triplets from `format=triplet`, delete the rollouts, delete the models.

usage: python trainer_step.py SPEC.json OUT.json   (run in .venv-agl1)
SPEC: {"base_url", "key", "model", "engine", "agent_class", "env_map", "data": {column: [values]}, "n", "timeout_s",
"hooks": a RolloutHooks file or null}
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def summary(completed: Any) -> dict[str, Any]:
    return {
        "rollout_id": completed.rollout_id,
        "data_id": completed.data_id,
        "input": completed.input,
        "metadata": completed.metadata,
        "state": completed.rollout_state.value if completed.rollout_state else None,
        "error_message": completed.error_message,
        "final_reward": completed.final_reward,
        "running_at": completed.running_at,
        "finished_at": completed.finished_at,
        "triplets": [
            {
                "prompt_ids": t.prompt["token_ids"],
                "response_ids": t.response["token_ids"],
                "log_probs": t.response["log_probs"],
                "reward": t.reward,
                "server": t.metadata.get("server"),
            }
            for t in completed.triplets or []
        ],
        "event_types": [e["event_type"] for e in completed.events],
        "attempts": sorted({e["attempt_id"] for e in completed.events}),
    }


def wait_on_terminal_cursor(manager: Any, rollout_ids: set[str], timeout_s: float) -> tuple[list[Any], list[int]]:
    """What an async v1.0 consumer does: page the completion log from a cursor until every rollout has ended."""
    from agentlightning.server.routes.rollouts import TerminalRolloutsPage

    seen: dict[str, Any] = {}
    cursors = []
    after = 0
    deadline = time.monotonic() + timeout_s
    while not rollout_ids <= seen.keys():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rollouts not terminal: {sorted(rollout_ids - seen.keys())}")
        response = manager.client.get("/api/rollouts/terminal", params={"after": after, "limit": 2})
        response.raise_for_status()
        page = TerminalRolloutsPage.model_validate(response.json())
        for item in page.items:
            seen[item.rollout_id] = item
        after = page.next_after
        cursors.append(after)
        if not page.items:
            time.sleep(0.2)
    return [seen[rid] for rid in sorted(rollout_ids)], cursors


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    from agentlightning.hooks import load_hooks
    from agentlightning.schemas import Model
    from agentlightning.verl.agl_rollout_manager import AglRolloutManager

    manager = AglRolloutManager(
        agl_base_url=spec["base_url"],
        agl_key=spec["key"],
        model=spec["model"],
        step=1,
        train_rollout_n=spec["n"],
        rollout_timeout_seconds=spec["timeout_s"],
        poll_interval_seconds=0.2,
        local_agent_class=spec["agent_class"],
        local_env_map=spec["env_map"],
        hooks=load_hooks(spec["hooks"]) if spec.get("hooks") else None,
    )
    registered = manager.register_model([spec["engine"]])

    # The sync trainer's step: enqueue, poll each rollout until terminal, build triplets, delete.
    completed = manager.enqueue_and_wait_until_completed(spec["data"], is_train=True)

    # An async consumer's step: enqueue, follow the terminal cursor, then read and delete each rollout.
    enqueued = manager._create_rollouts(spec["data"], is_train=False)
    items, cursors = wait_on_terminal_cursor(manager, {e.rollout_id for e in enqueued}, spec["timeout_s"])
    followed = []
    for enqueued_rollout in enqueued:
        rollout = manager._get_rollout(enqueued_rollout.rollout_id)
        followed.append(manager._build_completed_rollout(enqueued_rollout, rollout))
        manager._delete_rollout(enqueued_rollout.rollout_id)
    gone = [manager.client.get(f"/api/rollouts/{e.rollout_id}").status_code for e in [*completed, *followed]]
    deleted_models = manager.delete_model()

    answer = {
        "registered": [Model.model_validate(m).model_dump() for m in registered],
        "completed": [summary(c) for c in completed],
        "followed": [summary(c) for c in followed],
        "terminal_items": [item.model_dump(mode="json") for item in items],
        "cursors": cursors,
        "after_delete": gone,
        "deleted_models": deleted_models,
    }
    with open(sys.argv[2], "w") as file:
        json.dump(answer, file)


if __name__ == "__main__":
    main()
