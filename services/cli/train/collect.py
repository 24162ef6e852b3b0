"""Rollouts run outside a training step (the smoke rollout before training, `agl try`, `agl eval`, the quick demo):
build them from the agent's options, create them, follow the terminal stream until each has ended, turn each into
one plain record, and say in one line what went wrong with one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient

STATE_NAMES = {
    rollout_pb2.ROLLOUT_STATE_QUEUING: "queued",
    rollout_pb2.ROLLOUT_STATE_RUNNING: "running",
    rollout_pb2.ROLLOUT_STATE_SUCCEEDED: "succeeded",
    rollout_pb2.ROLLOUT_STATE_FAILED: "failed",
}
REFUSED_EVENT = "proxy_refused_event"  # the proxy's warning when it refuses an agent's event (services/proxy)


class AgentLaunch(Protocol):
    """How the agent runs (a TrainPlan, an AgentPlan: services/cli/train/plan.py)."""

    agent_class: str
    command: tuple[str, ...]
    env_map: dict[str, str]
    rollout_timeout: float


def agent_spec(
    agent: AgentLaunch, rollout_id: str, task: Any, labels: Mapping[str, str], *, is_train: bool
) -> rollout_pb2.RolloutSpec:
    """One rollout of the agent on task, launched by the local runner as the trainer's rollouts are."""
    config = rollout_pb2.RolloutConfig(
        timeout_seconds=agent.rollout_timeout,
        local=rollout_pb2.LocalLaunchConfig(
            agent_class=agent.agent_class, command=list(agent.command), env_map=agent.env_map
        ),
    )
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id,
        input_json=json.dumps(task),
        is_train=is_train,
        config=config,
        metadata=rollout_pb2.RolloutMetadata(labels=dict(labels)),
    )


def trajectory(entry: Any) -> dict[str, Any]:
    """One record: the rollout, its reward and its model calls with token ids."""
    rollout = entry.rollout
    record: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "group": rollout.metadata.labels.get("group", ""),
        "state": STATE_NAMES.get(rollout.status.state, str(rollout.status.state)),
        "error": rollout.status.error_message,
        "input": json.loads(rollout.input_json or "null"),
        "reward": None,
        "calls": [],
    }
    for event in entry.events:
        if event.event_type == "reward" and event.WhichOneof("payload") == "reward":
            record["reward"] = event.reward.value if event.reward.HasField("value") else None
        elif event.event_type == "model_request":
            call = event.model_request
            record["calls"].append(
                {
                    "prompt_token_ids": list(call.prompt_token_ids),
                    "response_token_ids": list(call.response_token_ids),
                    "response_logprobs": list(call.response_logprobs) if call.has_response_logprobs else None,
                    "model": call.model,
                    "model_version": call.model_version,
                    "http_status": call.http_status,
                    # A refused call: what the engine said, and the request it refused (the prompt's size is
                    # measured from it: prompt_fit.py).
                    **(_refusal(call) if call.http_status >= 400 else {}),
                }
            )
    return record


def _refusal(call: Any) -> dict[str, Any]:
    try:
        body = json.loads(call.response_json or "null")
    except ValueError:
        body = call.response_json
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    try:
        request = json.loads(call.request_json or "null")
    except ValueError:
        request = None
    return {"error": " ".join(str(message or "").split())[:2000], "request": request}


async def consume_terminal(
    client: LedgerClient,
    labels: Mapping[str, str],
    total: int,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The terminal rollouts carrying labels (with their events), until `total` distinct ones arrived."""
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    async for entry in client.watch_terminal(labels=dict(labels), include_events=True):
        if entry.rollout.rollout_id in seen:
            continue
        seen.add(entry.rollout.rollout_id)
        record = trajectory(entry)
        if on_record is not None:
            on_record(record)
        records.append(record)
        if len(records) == total:
            break
    return records


async def attach_proxy_warnings(client: LedgerClient, records: Sequence[dict[str, Any]]) -> None:
    """For a rollout that failed or has no reward: the proxy's first refusal of one of its events (a misspelled
    reward's 422, say), kept as record["proxy_error"]."""
    for record in records:
        if record["state"] == "succeeded" and record["reward"] is not None:
            continue
        warnings = await client.list_events(record["rollout_id"], attempt_id="*", event_type=REFUSED_EVENT)
        for event in warnings[:1]:
            try:
                data = json.loads(event.data_json)
                record["proxy_error"] = f"proxy refused an event ({data['status']} {data['code']}): {data['message']}"
            except (ValueError, KeyError, TypeError):
                continue


def failure_line(record: Mapping[str, Any], reward_required: bool = True) -> str | None:
    """What went wrong with a rollout that failed or succeeded without a reward (None for a rewarded success; for
    any success when a judge gives the rewards: reward_required false)."""
    proxy_error = record.get("proxy_error")
    if record["state"] != "succeeded":
        return f"{record['rollout_id']}: {record['state']}: {proxy_error or record['error'] or 'no reason recorded'}"
    if record["reward"] is None and reward_required:
        why = proxy_error or "the agent posted no reward event and run() returned no number"
        return f"{record['rollout_id']}: succeeded WITHOUT A REWARD: {why}"
    return None


async def run_rollouts(
    client: LedgerClient,
    specs: Sequence[rollout_pb2.RolloutSpec],
    labels: Mapping[str, str],
    deadline_s: float,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Creates the specs (every one carries `labels`) and returns their records in spec order once all ended;
    asyncio.TimeoutError after deadline_s."""
    await client.create_rollouts(list(specs))
    records = await asyncio.wait_for(consume_terminal(client, labels, len(specs), on_record), deadline_s)
    await attach_proxy_warnings(client, records)
    order = {spec.rollout_id: index for index, spec in enumerate(specs)}
    return sorted(records, key=lambda record: order.get(record["rollout_id"], len(order)))


# What a Python agent raises when nothing answers at its base URL (the OpenAI SDK's, httpx's, requests').
_CONNECTION_ERRORS = ("APIConnectionError", "ConnectError", "ConnectionError", "Connection refused")


def rollout_problem(record: Mapping[str, Any], log: Path, reward_required: bool = True) -> str | None:
    """The one line that says what went wrong with a rollout of the agent (None when nothing did): it failed (with
    the controller's reason, which ends with the agent's last line), posted no reward (unless a judge gives the
    rewards: reward_required false), made no model call or had a call refused."""
    failed = failure_line(record, reward_required)
    if failed:
        if not record["calls"] and any(name in failed for name in _CONNECTION_ERRORS):
            failed += " (no call reached AGL_OPENAI_BASE_URL: does the agent use it as its base URL?)"
        # The controller's reason names the agent's log already when the agent ran (not when it could not start).
        return failed if str(log) in failed else f"{failed} (agent log: {log})"
    if not record["calls"]:
        return f"{record['rollout_id']}: the agent made no model call through AGL_OPENAI_BASE_URL (agent log: {log})"
    bad = [call for call in record["calls"] if call.get("http_status", 200) >= 400]
    if bad:
        said = f": {bad[0]['error'][:300]}" if bad[0].get("error") else ""
        return f"{record['rollout_id']}: a model call got HTTP {bad[0]['http_status']}{said} (agent log: {log})"
    return None
