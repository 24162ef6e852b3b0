"""Issue 27's table, row by row: what Agent Lightning v1.0's own clients send, answered as v1.0 answers it, over HTTP
against the real proxy and ledger (the gateway's pause routes, attempt "0" on a rollout nobody claimed, its
attempts list, model_request events in v1.0's shape and their triplet view, /healthz), and the per-attempt rules
for AGL's own agents kept beside them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token

from .conftest import AUTH, KEY, MODEL, Http, base_url, event_url, new_rollout, run_proxy

RUNNING, SUCCEEDED = rollout_pb2.ROLLOUT_STATE_RUNNING, rollout_pb2.ROLLOUT_STATE_SUCCEEDED


def api(proxy: Http) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=30)


async def queued_rollout(http: httpx.AsyncClient, **item: Any) -> str:
    rollout_id = uuid.uuid4().hex
    created = await http.post("/api/rollouts", json=[{"input": {"q": 1}, "rollout_id": rollout_id, **item}])
    assert created.status_code == 201, created.text
    return rollout_id


def v1_model_request(prompt: list[int], response: list[int], logprobs: list[float] | None, **extra: Any) -> Any:
    """A call the way v1.0's gateway recorded it (agentlightning/server/proxy.py's _capture_event)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "The answer is 42."},
        "finish_reason": "stop",
        "token_ids": response,
    }
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": f"t{k}", "logprob": lp} for k, lp in enumerate(logprobs)]}
    body = {"object": "chat.completion", "model": MODEL, "prompt_token_ids": prompt, "choices": [choice]}
    body["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(response), "total_tokens": 9}
    data = {
        "model": MODEL,
        "model_version": 3,
        "request": {"model": MODEL, "messages": [{"role": "user", "content": "6 * 7?"}]},
        "response": body,
        "server": {"model": MODEL, "endpoint": "http://engine:8000/v1", "version": 3},
        "latency_ms": 12.5,
        "http_status": 200,
        "status": "ok",
        "retry_count": 1,
        "routed_experts": None,
        "usage": body["usage"],
        "finish_reason": "stop",
    }
    data.update(extra)
    return {"event_type": "model_request", "data": data}


# -- the gateway's pause, drain and resume ---------------------------------------------------------------------


async def test_v1_pause_state_and_resume_answer_as_v1_and_pause_every_call(proxy: Http, client: LedgerClient) -> None:
    rollout_id = await new_rollout(client)
    async with api(proxy) as http:
        paused = await http.post("/proxy/pause", json={"reason": "weights update", "retry_after_seconds": 9})
        try:
            assert paused.status_code == 200, paused.text
            body = paused.json()
            assert set(body) == {"paused", "retry_after_seconds", "reason", "inflight"}
            assert body["paused"] is True and body["retry_after_seconds"] == 9 and body["reason"] == "weights update"
            assert isinstance(body["inflight"], int)
            # v1.0's trainer polls the state until nothing is in flight: the replica reports the pause at once.
            for _ in range(100):
                state = (await http.get("/proxy/state")).json()
                if state["inflight"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert state == {"paused": True, "retry_after_seconds": 9, "reason": "weights update", "inflight": 0}
            call = await http.post(
                f"{base_url(proxy, rollout_id)}/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert call.status_code == 429 and call.headers["retry-after"] == "9"
        finally:
            resumed = await http.post("/proxy/resume")
        assert resumed.status_code == 200
        assert resumed.json() == {"paused": False, "retry_after_seconds": 9, "reason": None, "inflight": 0}
        call = await http.post(
            f"{base_url(proxy, rollout_id)}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert call.status_code == 200, call.text


async def test_v1_drain_counts_a_call_in_flight_until_it_ends(proxy: Http, client: LedgerClient) -> None:
    rollout_id = await new_rollout(client)
    async with api(proxy) as http:
        slow = asyncio.create_task(
            http.post(
                f"{base_url(proxy, rollout_id)}/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "standin": {"delay_ms": 1500}},
            )
        )
        try:
            await asyncio.sleep(0.5)  # the call is at the engine
            paused = await http.post("/proxy/pause", json={"reason": "drain"})
            assert paused.status_code == 200 and paused.json()["inflight"] >= 1, paused.text
            assert (await http.get("/proxy/state")).json()["inflight"] >= 1
            reply = await slow
            assert reply.status_code == 200  # a call already in flight finishes during the pause
            for _ in range(100):
                if (await http.get("/proxy/state")).json()["inflight"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await http.get("/proxy/state")).json()["inflight"] == 0
        finally:
            await http.post("/proxy/resume")


async def test_v1_state_counts_the_calls_of_every_replica(ledger, engine: Http, client: LedgerClient) -> None:
    """v1.0's gateway was one process; here v1.0's trainer may ask any replica: a call in flight on another one
    keeps `inflight` above 0 until it ends, so v1.0's drain loop waits for it."""
    rollout_id = await new_rollout(client)
    with run_proxy(ledger.address) as asked, run_proxy(ledger.address) as other:
        async with api(asked) as http, httpx.AsyncClient(headers=AUTH, timeout=30) as agent:
            sent = time.monotonic()
            slow = asyncio.create_task(
                agent.post(
                    f"{base_url(other, rollout_id)}/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "hi"}],
                        "standin": {"delay_ms": 2000},
                    },
                )
            )
            try:
                await asyncio.sleep(0.5)
                paused = await http.post("/proxy/pause", json={"reason": "update"})
                assert paused.status_code == 200 and paused.json()["inflight"] >= 1, paused.text
                seen = []  # (seconds since the call was sent, inflight)
                while not slow.done():
                    seen.append((time.monotonic() - sent, (await http.get("/proxy/state")).json()["inflight"]))
                    await asyncio.sleep(0.1)
                assert (await slow).status_code == 200
                # The call cannot end before its 2 s at the engine, so a 0 read before then is a replica's call
                # not counted; a 0 read after it may be the call ending before its answer reached this client.
                assert seen and seen[0][1] >= 1, seen
                early_zero = [(at, n) for at, n in seen if n == 0 and at < 2.0]
                assert not early_zero, seen
                for _ in range(100):
                    if (await http.get("/proxy/state")).json()["inflight"] == 0:
                        break
                    await asyncio.sleep(0.05)
                assert (await http.get("/proxy/state")).json()["inflight"] == 0
            finally:
                await http.post("/proxy/resume")


async def test_v1_pause_refuses_what_v1_refuses_and_needs_the_master_key(proxy: Http) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=10) as anonymous:
        for method, path in (("POST", "/proxy/pause"), ("POST", "/proxy/resume"), ("GET", "/proxy/state")):
            reply = await anonymous.request(method, path, json={})
            assert reply.status_code == 401 and reply.json() == {"detail": "Invalid or missing API key"}
    async with api(proxy) as http:
        for body, field in (
            ({"retry_after_seconds": "soon"}, "retry_after_seconds"),
            ({"retry_after_seconds": 2.5}, "retry_after_seconds"),
            ({"retry_after_seconds": 10**6}, "retry_after_seconds"),
            ({"reason": 7}, "reason"),
            ([1], "object"),
        ):
            reply = await http.post("/proxy/pause", json=body)
            assert reply.status_code == 422 and field in reply.json()["detail"], (body, reply.text)
        assert (await http.get("/proxy/state")).json()["paused"] is False  # nothing refused paused anything


# -- attempt "0" --------------------------------------------------------------------------------------------------


async def test_attempt_0_on_a_rollout_nobody_claimed_is_stored_and_listed_as_v1_does(
    proxy: Http, client: LedgerClient
) -> None:
    async with api(proxy) as http:
        rollout_id = await queued_rollout(http)
        posted = await http.post(
            f"/api/rollouts/{rollout_id}/attempt/0/events",
            json={"event_type": "reward", "data": {"value": 0.5, "source": "evaluator"}},
        )
        assert posted.status_code == 200, posted.text
        assert posted.json()["attempt_id"] == "0" and posted.json()["data"] == {"value": 0.5, "source": "evaluator"}
        note = await http.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json={"event_type": "hook_note"})
        assert note.status_code == 200
        detail = (await http.get(f"/api/rollouts/{rollout_id}")).json()
        assert detail["attempts"] == ["0"] and detail["rollout"]["status"]["state"] == "queuing"
        events = (await http.get(f"/api/rollouts/{rollout_id}/events")).json()
        assert [(e["event_type"], e["attempt_id"]) for e in events] == [("reward", "0"), ("hook_note", "0")]
        # The ledger holds them under no attempt: nothing was filed under an attempt no controller started.
        stored = await client.get_rollout(rollout_id)
        assert stored.status.attempt_id == "" and not stored.status.attempts
        assert [e.attempt_id for e in await client.list_events(rollout_id, attempt_id="*")] == ["", ""]

        # AGL's controller claims it with its own attempt id: v1.0's "0" now names that attempt, and v1.0's listing
        # (the current attempt) still holds what was posted before the claim, as v1.0's single attempt did.
        await client.update_status(rollout_id, RUNNING, attempt_id="at-7")
        later = await http.post(
            f"/api/rollouts/{rollout_id}/attempt/0/events", json={"event_type": "reward", "data": {"value": 1}}
        )
        assert later.status_code == 200 and later.json()["attempt_id"] == "at-7"
        events = (await http.get(f"/api/rollouts/{rollout_id}/events")).json()
        assert [e["attempt_id"] for e in events] == ["0", "0", "at-7"]
        assert [
            e["data"]["value"]
            for e in (await http.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"})).json()
        ] == [0.5, 1]
        assert (await http.get(f"/api/rollouts/{rollout_id}")).json()["attempts"] == ["0", "at-7"]


async def test_attempt_0_keeps_the_per_attempt_rules_for_agents_and_finished_rollouts(
    proxy: Http, client: LedgerClient
) -> None:
    rollout_id = await new_rollout(client, attempt_id="at-1")
    token = agent_token(KEY, rollout_id, "at-1")
    async with httpx.AsyncClient(timeout=10) as http:
        reward = {"event_type": "reward", "data": {"value": 1.0}}
        # An agent's token names its own attempt only: "0" is not an alias for it.
        as_agent = await http.post(
            event_url(proxy, rollout_id, "0"), json=reward, headers={"authorization": f"Bearer {token}"}
        )
        assert as_agent.status_code == 401
        own = await http.post(
            event_url(proxy, rollout_id, "at-1"), json=reward, headers={"authorization": f"Bearer {token}"}
        )
        assert own.status_code == 200
        # The master key on an attempt the rollout never had is still 404.
        unknown = await http.post(event_url(proxy, rollout_id, "at-9"), json=reward, headers=AUTH)
        assert unknown.status_code == 404 and "at-9" in unknown.json()["error"]["message"]
        # "0" with the master key names the current attempt, for model calls too.
        call = await http.post(
            f"{base_url(proxy, rollout_id, '0')}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "2 + 2?"}]},
            headers=AUTH,
        )
        assert call.status_code == 200, call.text
        calls = await client.list_events(rollout_id, event_type="model_request")
        assert [e.attempt_id for e in calls] == ["at-1"]
        # A finished rollout takes nothing, through "0" either.
        await client.update_status(rollout_id, SUCCEEDED)
        late = await http.post(event_url(proxy, rollout_id, "0"), json=reward, headers=AUTH)
        assert late.status_code == 409
        missing = await http.post(event_url(proxy, "no-such-rollout", "0"), json=reward, headers=AUTH)
        assert missing.status_code == 404
    assert len(await client.list_events(rollout_id, attempt_id="*")) == 2  # the agent's reward and the call


async def test_a_v1_controller_rollout_keeps_its_literal_attempt_0(proxy: Http, client: LedgerClient) -> None:
    async with api(proxy) as http:
        rollout_id = await queued_rollout(http)
        claimed = await http.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}})
        assert claimed.json()["status"]["last_attempt_id"] == "0"
        posted = await http.post(
            f"/api/rollouts/{rollout_id}/attempt/0/events", json={"event_type": "reward", "data": {"value": 1}}
        )
        assert posted.status_code == 200 and posted.json()["attempt_id"] == "0"
    assert [e.attempt_id for e in await client.list_events(rollout_id, attempt_id="*")] == ["0"]


# -- model_request events in v1.0's shape -------------------------------------------------------------------------


async def test_v1_shaped_model_requests_enter_the_triplet_view_deduped_by_prompt(
    proxy: Http, client: LedgerClient
) -> None:
    async with api(proxy) as http:
        rollout_id = await queued_rollout(http)
        url = f"/api/rollouts/{rollout_id}/attempt/0/events"
        first = v1_model_request([1, 2, 3], [7, 8], [-0.5, -0.25])
        retried = v1_model_request([1, 2, 3], [9], [-0.125])  # same prompt: only the last is kept
        second = v1_model_request([1, 2, 3, 9, 4], [5], None)  # no log-probs: null, not an error
        for body in (first, retried, second):
            reply = await http.post(url, json=body)
            assert reply.status_code == 200, reply.text
        await http.post(url, json={"event_type": "reward", "data": {"value": 1.0}})
        triplets = (await http.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"})).json()
        assert [e["event_type"] for e in triplets] == ["model_request", "model_request", "reward"]
        kept, last = triplets[0]["data"], triplets[1]["data"]
        assert kept["prompt_token_ids"] == [1, 2, 3] and kept["response_token_ids"] == [9]
        assert kept["response_log_probs"] == [-0.125]
        assert kept["server"] == {"model": MODEL, "version": 3} and kept["status"] == "ok"
        assert "http_status" not in kept  # the ledger's triplet view keeps `status` (error for an HTTP error)
        assert last["prompt_token_ids"] == [1, 2, 3, 9, 4] and last["response_log_probs"] is None
        assert triplets[2]["data"] == {"value": 1.0}
        # The full listing gives the call back with its request and response.
        full = (await http.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"})).json()
        assert len(full) == 3 and full[0]["data"]["response"]["prompt_token_ids"] == [1, 2, 3]
        assert full[0]["data"]["latency_ms"] == pytest.approx(12.5) and full[0]["data"]["retry_count"] == 1
    (stored, *_) = await client.list_events(rollout_id, event_type="model_request")
    call = stored.model_request
    assert list(call.prompt_token_ids) == [1, 2, 3] and list(call.response_token_ids) == [7, 8]
    assert call.has_response_logprobs and list(call.response_logprobs) == [-0.5, -0.25]
    assert call.model == MODEL and call.model_version == 3 and call.endpoint == "http://engine:8000/v1"
    assert call.api == "chat.completions" and call.finish_reason == "stop"
    assert call.status == event_pb2.MODEL_REQUEST_STATUS_OK and call.usage.total_tokens == 9


async def test_v1_completions_and_stream_chunk_shapes_give_their_token_ids(proxy: Http) -> None:
    async with api(proxy) as http:
        rollout_id = await queued_rollout(http)
        url = f"/api/rollouts/{rollout_id}/attempt/0/events"
        completion = {
            "object": "text_completion",
            "choices": [
                {
                    "text": " 42",
                    "prompt_token_ids": [4, 5],
                    "token_ids": [6],
                    "logprobs": {"token_logprobs": [-1.0]},
                }
            ],
        }
        chunks = [
            {"prompt_token_ids": [10, 11], "choices": [{"token_ids": [12]}]},
            {"choices": [{"token_ids": [13, 14]}]},
        ]
        for response in (completion, chunks):
            body = {"event_type": "model_request", "data": {"response": response, "server": {"model": MODEL}}}
            assert (await http.post(url, json=body)).status_code == 200
        triplets = (await http.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"})).json()
        assert [(t["data"]["prompt_token_ids"], t["data"]["response_token_ids"]) for t in triplets] == [
            ([4, 5], [6]),
            ([10, 11], [12, 13, 14]),
        ]
        assert triplets[0]["data"]["response_log_probs"] == [-1.0] and triplets[1]["data"]["response_log_probs"] is None


async def test_model_requests_that_would_corrupt_training_data_are_refused(proxy: Http, client: LedgerClient) -> None:
    rollout_id = await new_rollout(client, attempt_id="at-1")
    token = agent_token(KEY, rollout_id, "at-1")
    good = v1_model_request([1, 2], [3], [-0.5])
    async with httpx.AsyncClient(timeout=10) as http:
        # An agent's token cannot write a model call: the proxy records those itself.
        forged = await http.post(
            event_url(proxy, rollout_id, "at-1"), json=good, headers={"authorization": f"Bearer {token}"}
        )
        assert forged.status_code == 403 and "master key" in forged.json()["error"]["message"]
        for data, field in (
            ({"response": {"prompt_token_ids": [1, "2"], "choices": []}}, "response.prompt_token_ids[1]"),
            ({"response": {"choices": [{"token_ids": [1.5]}]}}, "response.choices[0].token_ids[0]"),
            ({"response": {"choices": [{"token_ids": [True]}]}}, "response.choices[0].token_ids[0]"),
            ({"response": {"prompt_token_ids": [2**70], "choices": []}}, "response.prompt_token_ids[0]"),
            ({"response": "text"}, "response"),
            ({"status": "fine"}, "status"),
            ({"server": {"version": "v3"}}, "server.version"),
            ({"latency_ms": "fast"}, "latency_ms"),
            ({"usage": {"total_tokens": -1}}, "usage.total_tokens"),
        ):
            body = {"event_type": "model_request", "data": data}
            reply = await http.post(event_url(proxy, rollout_id, "at-1"), json=body, headers=AUTH)
            assert reply.status_code == 422 and f"`data.{field}`" in reply.json()["error"]["message"], (
                data,
                reply.text,
            )
        for event_type in ("model_request", "note", "reward"):
            not_object = await http.post(
                event_url(proxy, rollout_id, "at-1"), json={"event_type": event_type, "data": [1]}, headers=AUTH
            )
            assert not_object.status_code == 422 and "`data` must be a JSON object, not an array" in not_object.text
    stored = await client.list_events(rollout_id, attempt_id="*")
    assert all(e.event_type == "proxy_refused_event" for e in stored), [e.event_type for e in stored]
    assert not await client.list_events(rollout_id, event_type="model_request")


async def test_a_v1_shaped_copy_of_a_recorded_call_reads_back_as_the_call(proxy: Http, client: LedgerClient) -> None:
    """A call the proxy recorded, exported through v1.0's listing and imported into another rollout in v1.0's shape,
    gives the same triplet."""
    rollout_id = await new_rollout(client, attempt_id="at-1")
    async with api(proxy) as http:
        call = await http.post(
            f"{base_url(proxy, rollout_id)}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "What is 6 * 7?"}]},
        )
        assert call.status_code == 200
        (recorded,) = (
            await http.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"})
        ).json()
        data = recorded["data"]
        response = dict(data["response"])
        response["prompt_token_ids"] = data["prompt_token_ids"]
        response["choices"] = [dict(response["choices"][0], token_ids=data["response_token_ids"])]
        imported = await queued_rollout(http)
        body = {"event_type": "model_request", "data": {**data, "response": response}}
        assert (await http.post(f"/api/rollouts/{imported}/attempt/0/events", json=body)).status_code == 200
        views = []
        for rid in (rollout_id, imported):
            (triplet,) = (await http.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"})).json()
            views.append(triplet["data"])
    assert views[0] == views[1] and views[0]["response_log_probs"] and views[0]["response_token_ids"]


# -- health ----------------------------------------------------------------------------------------------------


def test_healthz_is_exactly_v1s_body_and_the_replica_details_moved_to_status(proxy: Http) -> None:
    health = httpx.get(f"{proxy.url}/healthz")
    assert health.status_code == 200 and health.content == json.dumps({"status": "ok"}, separators=(",", ":")).encode()
    assert health.json() == {"status": "ok"}
    status = httpx.get(f"{proxy.url}/status").json()
    assert status["status"] == "ok" and status["model"] == MODEL and status["endpoints"]
    assert {"replica_id", "paused", "in_flight"} <= set(status)
