"""Agent Lightning v1.0's REST routes on the proxy, driven with plain HTTP the way v1.0's trainer, controller and
scripts send them (bodies, query strings, the master key), checked against the ledger's own gRPC view."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import httpx
import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token

from .conftest import AUTH, KEY, MODEL, Http, base_url, event_url, model_endpoints

RUNNING, SUCCEEDED = rollout_pb2.ROLLOUT_STATE_RUNNING, rollout_pb2.ROLLOUT_STATE_SUCCEEDED


def api(proxy: Http) -> httpx.AsyncClient:
    """What v1.0's AgentLightningAsyncClient is: httpx with the server's base URL and the key as a bearer."""
    return httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=10)


def new_id() -> str:
    return uuid.uuid4().hex


async def terminal_after(http: httpx.AsyncClient, after: int) -> dict[str, Any]:
    response = await http.get("/api/rollouts/terminal", params={"after": after})
    assert response.status_code == 200
    return response.json()


async def test_a_rollouts_life_through_v1_routes_equals_the_grpc_view(proxy: Http, client: LedgerClient) -> None:
    rollout_id = new_id()
    question = {"data_id": "q-17", "question": "What is 6 * 7?", "answer": "42"}
    body = [
        {
            "input": question,
            "is_train": True,
            "rollout_id": rollout_id,
            "config": {"timeout_seconds": 120, "local": {"agent_class": "agents.math:MathAgent", "env_map": {}}},
            "metadata": {"batch_idx": 3, "sample_idx_in_batch": 1, "run": "r1"},
        },
        {"input": "second", "is_train": False},
    ]
    async with api(proxy) as http:
        first = await http.post("/api/rollouts", json=body)
        assert first.status_code == 201
        created = first.json()
        assert len(created) == 2 and created[0]["rollout_id"] == rollout_id and created[1]["rollout_id"]
        assert created[0]["status"]["state"] == "queuing" and created[0]["status"]["version"] == 1
        assert created[0]["metadata"]["batch_idx"] == 3 and created[0]["config"]["timeout_seconds"] == 120
        assert created[1]["config"]["timeout_seconds"] == 3600  # v1.0's default
        stored = await client.get_rollout(rollout_id)
        assert json.loads(stored.input_json) == question and stored.is_train
        assert stored.config.local.agent_class == "agents.math:MathAgent" and stored.config.timeout_seconds == 120
        assert stored.metadata.labels["run"] == "r1" and stored.metadata.labels["batch_idx"] == "3"
        assert stored.status.state == rollout_pb2.ROLLOUT_STATE_QUEUING
        assert created[0]["status"]["created_at"] == pytest.approx(stored.status.create_time.ToNanoseconds() / 1e9)

        # The controller's poll and claim.
        listed = await http.get(
            "/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running"), ("limit", 50)]
        )
        assert listed.status_code == 200 and rollout_id in {item["rollout_id"] for item in listed.json()}
        claimed = await http.patch(
            f"/api/rollouts/{rollout_id}", json={"status": {"state": "running", "last_attempt_id": "0"}}
        )
        assert claimed.status_code == 200 and claimed.json()["status"]["state"] == "running"
        assert claimed.json()["status"]["last_attempt_id"] == "0" and claimed.json()["status"]["version"] == 2
        stored = await client.get_rollout(rollout_id)
        assert stored.status.state == RUNNING and stored.status.attempt_id == "0" and stored.status.version == 2

        # Create is idempotent: the same body again returns the rollouts as they are now, and creates nothing.
        again = await http.post("/api/rollouts", json=body[:1])
        assert again.status_code == 201 and again.json()[0]["status"]["state"] == "running"

        # The agent: one model call through the proxy and a reward, on attempt "0".
        call = await http.post(
            f"{base_url(proxy, rollout_id, '0')}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": question["question"]}]},
        )
        assert call.status_code == 200
        reward = await http.post(
            event_url(proxy, rollout_id, "0"), json={"event_type": "reward", "data": {"value": 1.0}}
        )
        assert reward.status_code == 200
        # v1.0's clients validate the answer as an Event: event_type, rollout_id, attempt_id, timestamp, data.
        answer = reward.json()
        assert answer["data"] == {"value": 1.0} and answer["event_type"] == "reward" and answer["attempt_id"] == "0"
        assert isinstance(answer["timestamp"], float) and answer["rollout_id"] == rollout_id
        await http.post(event_url(proxy, rollout_id, "0"), json={"event_type": "note", "data": {"text": "hi"}})
        odd = await http.post(
            event_url(proxy, rollout_id, "0"),
            content=b'{"event_type": "odd", "data": {"x": NaN}}',
            headers={"content-type": "application/json"},
        )
        assert odd.status_code == 200 and odd.json()["data"] == {}  # stored as sent, not echoed as invalid JSON

        done = await http.patch(
            f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded", "last_attempt_id": "0"}}
        )
        assert done.status_code == 200 and done.json()["status"]["state"] == "succeeded"

        # The trainer's poll: completion-ordered, resumable from next_after, projection only.
        page = await terminal_after(http, 0)
        grpc_page = await client.list_terminal(after_cursor=0, page_size=1000)
        assert [item["rollout_id"] for item in page["items"]] == [e.rollout.rollout_id for e in grpc_page.entries]
        mine = next(item for item in page["items"] if item["rollout_id"] == rollout_id)
        assert mine == {"rollout_id": rollout_id, "state": "succeeded", "data_id": "q-17", "is_train": True}
        assert page["next_after"] == grpc_page.next_cursor and page["total_terminal"] == page["next_after"]
        later = await terminal_after(http, page["next_after"])
        assert later["items"] == [] and later["next_after"] == page["next_after"]

        # Its events, full and trimmed, as the gRPC views give them.
        full = (await http.get(f"/api/rollouts/{rollout_id}/events")).json()
        assert [event["event_type"] for event in full] == ["model_request", "reward", "note", "odd"]
        assert full[1]["timestamp"] == pytest.approx(answer["timestamp"], abs=1.0)
        (recorded,) = await client.list_events(rollout_id, event_type="model_request")
        model_request = full[0]["data"]
        assert model_request["prompt_token_ids"] == list(recorded.model_request.prompt_token_ids)
        assert model_request["response_token_ids"] == list(recorded.model_request.response_token_ids)
        assert model_request["response_log_probs"] == list(recorded.model_request.response_logprobs)
        assert (
            model_request["response"]["choices"][0]["message"]["content"]
            == call.json()["choices"][0]["message"]["content"]
        )
        assert model_request["request"]["messages"][0]["content"] == question["question"]
        assert model_request["status"] == "ok" and model_request["http_status"] == 200 and full[0]["attempt_id"] == "0"
        assert full[0]["timestamp"] == pytest.approx(recorded.create_time.ToNanoseconds() / 1e9)
        assert full[1]["data"] == {"value": 1.0} and full[2]["data"] == {"text": "hi"}
        only_rewards = (await http.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "reward"})).json()
        assert [event["event_type"] for event in only_rewards] == ["reward"]

        triplet = (await http.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"})).json()
        grpc_triplet = await client.list_events(rollout_id, view=event_pb2.EVENT_VIEW_TRIPLET)
        assert [event["event_type"] for event in triplet] == [event.event_type for event in grpc_triplet]
        trimmed = triplet[0]["data"]
        assert set(trimmed) >= {"prompt_token_ids", "response_token_ids", "response_log_probs", "server", "status"}
        assert "request" not in trimmed and "response" not in trimmed
        assert trimmed["prompt_token_ids"] == model_request["prompt_token_ids"]
        assert trimmed["response_log_probs"] == model_request["response_log_probs"]
        assert trimmed["server"] == {"model": MODEL, "version": 1}
        assert triplet[1]["data"] == {"value": 1.0}

        detail = (await http.get(f"/api/rollouts/{rollout_id}")).json()
        assert detail["attempts"] == ["0"] and detail["rollout"]["status"]["state"] == "succeeded"
        assert detail["rollout"]["input"] == question and detail["rollout"]["metadata"]["run"] == "r1"

        # Delete is idempotent, and takes the events along.
        for _ in range(2):
            deleted = await http.delete(f"/api/rollouts/{rollout_id}")
            assert deleted.status_code == 204
        assert (await http.get(f"/api/rollouts/{rollout_id}")).status_code == 404
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await client.get_rollout(rollout_id)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_illegal_moves_and_bad_bodies_get_v1_status_codes(proxy: Http, client: LedgerClient) -> None:
    async with api(proxy) as http:
        (created,) = (await http.post("/api/rollouts", json=[{"input": {"q": 1}}])).json()
        rollout_id = created["rollout_id"]
        url = f"/api/rollouts/{rollout_id}"
        skipped = await http.patch(url, json={"status": {"state": "succeeded"}})
        assert skipped.status_code == 409
        assert skipped.json()["detail"] == f"Rollout {rollout_id}: cannot transition queuing -> succeeded"  # v1.0's
        failed = await http.patch(
            url, json={"status": {"state": "failed", "error_message": "local subprocess spawn failed"}}
        )
        assert failed.status_code == 200 and failed.json()["status"]["error_message"] == "local subprocess spawn failed"
        assert (await client.get_rollout(rollout_id)).status.error_message == "local subprocess spawn failed"
        revived = await http.patch(url, json={"status": {"state": "running"}})
        assert revived.status_code == 409 and "failed -> running" in revived.json()["detail"]
        unchanged = await http.patch(url, json={})
        assert unchanged.status_code == 200 and unchanged.json()["status"]["version"] == 2

        assert (await http.patch(url, json={"status": {"state": "paused"}})).status_code == 422
        assert (await http.patch(url, json={"status": {"state": "failed", "priority": 1}})).status_code == 422
        assert (await http.patch(url, json={"input": 2})).status_code == 422
        missing = await http.patch(f"/api/rollouts/{new_id()}", json={"status": {"state": "running"}})
        assert missing.status_code == 404 and "not found" in missing.json()["detail"].lower()
        assert (await http.post("/api/rollouts", json={"input": 1})).status_code == 422  # not a list
        no_input = await http.post("/api/rollouts", json=[{"is_train": True}])
        assert no_input.status_code == 422 and no_input.json()["detail"] == "body[0].input is required."
        bad_id = await http.post("/api/rollouts", json=[{"input": 1, "rollout_id": "../etc"}])
        assert bad_id.status_code == 422 and "rollout_id" in bad_id.json()["detail"]
        assert (await http.post("/api/rollouts", content=b"[{")).status_code == 422
        bad_cursor = await http.get("/api/rollouts/terminal", params={"after": "x"})
        assert bad_cursor.status_code == 422
        assert (await http.get("/api/rollouts", params={"state_in": "done"})).status_code == 422
        assert (await http.get(f"/api/rollouts/{new_id()}/events")).status_code == 404


async def test_every_route_needs_the_master_key(proxy: Http, client: LedgerClient) -> None:
    rollout_id = new_id()
    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}")])
    token = agent_token(KEY, rollout_id, "0")  # an agent's own token opens its model and event routes only
    routes = [
        ("POST", "/api/rollouts", [{"input": 1}]),
        ("GET", "/api/rollouts?state_in=queuing", None),
        ("GET", "/api/rollouts/terminal?after=0", None),
        ("GET", f"/api/rollouts/{rollout_id}", None),
        ("PATCH", f"/api/rollouts/{rollout_id}", {"status": {"state": "failed"}}),
        ("DELETE", f"/api/rollouts/{rollout_id}", None),
        ("GET", f"/api/rollouts/{rollout_id}/events?format=triplet", None),
        ("POST", "/api/models", [{"model": "x", "endpoint": "http://x/v1"}]),
        ("DELETE", "/api/models", None),
    ]
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        for headers in ({}, {"authorization": f"Bearer {token}"}, {"x-api-key": "wrong"}):
            for method, path, body in routes:
                response = await http.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (method, path, headers)
                assert response.json() == {"detail": "Invalid or missing API key"}
        key_header = await http.get(f"/api/rollouts/{rollout_id}", headers={"x-api-key": KEY})
    assert key_header.status_code == 200
    assert (await client.get_rollout(rollout_id)).status.state == rollout_pb2.ROLLOUT_STATE_QUEUING


async def test_models_register_upsert_and_delete_all(proxy: Http, engine: Http, client: LedgerClient) -> None:
    async with api(proxy) as http:
        body = [{"model": "rest-model", "endpoint": "http://10.0.0.5:8000/v1", "version": 2}]
        registered = await http.post("/api/models", json=body)
        assert registered.status_code == 201 and registered.json() == body
        upsert = [{"model": "rest-model", "endpoint": "http://10.0.0.5:8000/v1", "version": 5}]
        assert (await http.post("/api/models", json=upsert)).json() == upsert
        (stored,) = await client.list_models("rest-model")
        assert (stored.endpoint, stored.version) == ("http://10.0.0.5:8000/v1", 5)
        assert (await http.post("/api/models", json=[{"model": "rest-model"}])).status_code == 422
        cleared = await http.delete("/api/models")
        assert cleared.status_code == 200 and cleared.json() == {"status": "ok"}
        assert await client.list_models() == []
    await client.register_models(model_endpoints(engine))  # the other tests' engine, back for what runs next
