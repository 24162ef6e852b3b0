"""v1.0's own server as the oracle: the same requests go to Agent Lightning v1.0's `agl-server` (from .venv-agl1)
and to AGL's proxy, and the answers are compared route by route (status codes, bodies, field names). Where AGL
differs on purpose (docs/reference/v1-compat.md, "Differences from v1.0"), the test says so and checks each
side's answer."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import Http, run_proxy, run_standin
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready

from .conftest import KEY, MODEL, Agl1

AUTH = {"authorization": f"Bearer {KEY}"}
_TIMES = ("created_at", "updated_at", "timestamp")


@contextlib.contextmanager
def v1_server(agl1: Agl1, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(agl1.bin / "agl-server"), "host=127.0.0.1", f"port={port}", f"key={KEY}"]
    argv += [f"default_proxy.model_name={MODEL}", f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    url = f"http://127.0.0.1:{port}"
    with start_service(argv, name="v1-server", ready=lambda _: wait_http_ready(f"{url}/healthz"), log_dir=tmp_path):
        yield url


@pytest.fixture(scope="module")
def servers(agl1: Agl1, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Http]]:
    """(v1.0's server, AGL's proxy, the stand-in engine both forward to)."""
    tmp_path = tmp_path_factory.mktemp("v1-server")
    with (
        run_standin() as engine,
        start_ledger(key=KEY) as ledger,
        run_proxy(ledger.address) as proxy,
        v1_server(agl1, tmp_path) as v1_url,
    ):
        for url in (v1_url, proxy.url):
            models = [{"model": MODEL, "endpoint": f"{engine.url}/v1"}]
            assert httpx.post(f"{url}/api/models", json=models, headers=AUTH).status_code == 201
        yield v1_url, proxy.url, engine


def normal(value: Any) -> Any:
    """An answer with what legitimately differs between two servers (clock readings) replaced by its type, and
    without AGL's one addition (an echoed event's `sequence`, its position in the rollout's log)."""
    if isinstance(value, dict):
        return {
            k: (type(v).__name__ if k in _TIMES and v is not None else normal(v))
            for k, v in value.items()
            if k != "sequence"
        }
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


Step = Callable[[httpx.Client, str], httpx.Response]


def both(servers: tuple[str, str, Http], step: Step) -> tuple[httpx.Response, httpx.Response]:
    """The step against v1.0 and against AGL, with the same fresh rollout id."""
    v1_url, agl_url, _ = servers
    rollout_id = uuid.uuid4().hex
    answers = []
    for url in (v1_url, agl_url):
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
            answers.append(step(client, rollout_id))
    return answers[0], answers[1]


def same(servers: tuple[str, str, Http], step: Step) -> Any:
    v1, agl = both(servers, step)
    assert agl.status_code == v1.status_code, (v1.text, agl.text)
    if v1.status_code != 204:
        assert normal(agl.json()) == normal(v1.json()), (v1.text, agl.text)
        return agl.json()
    return None


def create(client: httpx.Client, rollout_id: str, **item: Any) -> httpx.Response:
    body = {
        "rollout_id": rollout_id,
        "input": {"question": "What is 6 * 7?", "data_id": "q-1"},
        "config": {"timeout_seconds": 60, "local": {"agent_class": "agent.Agent", "env_map": {"Q": "input.question"}}},
        "metadata": {"batch_idx": 2, "sample_idx_in_batch": 0, "run": "r1"},
        **item,
    }
    return client.post("/api/rollouts", json=[body])


def patch(client: httpx.Client, rollout_id: str, **status: Any) -> httpx.Response:
    return client.patch(f"/api/rollouts/{rollout_id}", json={"status": status})


def test_a_call_on_a_rollout_nobody_claimed_is_forwarded_as_v1_does(servers: tuple[str, str, Http]) -> None:
    """v1.0 forwards a call on a queued rollout (an evaluation script's, with the key): so does AGL, through "0"."""

    def call(client: httpx.Client, rollout_id: str) -> httpx.Response:
        create(client, rollout_id)
        body = {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}
        reply = client.post(f"/proxy/rollout/{rollout_id}/attempt/0/mode/val/openai/v1/chat/completions", json=body)
        events = client.get(f"/api/rollouts/{rollout_id}/events").json()
        state = client.get(f"/api/rollouts/{rollout_id}").json()["rollout"]["status"]["state"]
        answer = reply.json()["choices"][0]["message"]["content"]
        return httpx.Response(reply.status_code, json=[answer, [e["attempt_id"] for e in events], state])

    assert same(servers, call) == ["The answer is 5.", ["0"], "queuing"]


def test_rollout_lifecycle_answers_equal_v1s(servers: tuple[str, str, Http]) -> None:
    def lifecycle(client: httpx.Client, rollout_id: str) -> httpx.Response:
        answers = [create(client, rollout_id), create(client, rollout_id)]  # the second is idempotent
        answers.append(client.get(f"/api/rollouts/{rollout_id}"))
        answers.append(patch(client, rollout_id, state="running", last_attempt_id="0", k8s_job_name="job-1"))
        answers.append(patch(client, rollout_id))  # nothing to change
        answers.append(client.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json={"event_type": "note"}))
        answers.append(patch(client, rollout_id, state="succeeded", error_message="done"))
        answers.append(client.get(f"/api/rollouts/{rollout_id}"))
        page = client.get("/api/rollouts/terminal", params={"after": 0, "limit": 1000}).json()
        item = next(i for i in page["items"] if i["rollout_id"] == rollout_id)
        answers.append(httpx.Response(200, json=item))
        answers.append(client.delete(f"/api/rollouts/{rollout_id}"))
        answers.append(client.delete(f"/api/rollouts/{rollout_id}"))  # idempotent
        answers.append(client.get(f"/api/rollouts/{rollout_id}"))
        return httpx.Response(200, json=[[a.status_code, a.json() if a.content else None] for a in answers])

    answers = same(servers, lifecycle)
    assert [status for status, _ in answers] == [201, 201, 200, 200, 200, 200, 200, 200, 200, 204, 204, 404]
    detail = answers[7][1]
    assert detail["rollout"]["status"]["state"] == "succeeded" and detail["attempts"] == ["0"]
    assert answers[8][1] == {"rollout_id": detail["rollout"]["rollout_id"], "state": "succeeded", "data_id": "q-1",
                             "is_train": True}  # fmt: skip


def test_generated_ids_defaults_and_listing_equal_v1s(servers: tuple[str, str, Http]) -> None:
    def generated(client: httpx.Client, rollout_id: str) -> httpx.Response:
        created = client.post("/api/rollouts", json=[{"input": "plain", "is_train": False}]).json()
        generated_id = created[0]["rollout_id"]
        assert len(generated_id) == 32 and int(generated_id, 16) >= 0  # uuid hex, as v1.0 makes them
        listed = client.get("/api/rollouts", params=[("state_in", "queuing"), ("limit", 10_000)]).json()
        found = [r for r in listed if r["rollout_id"] == generated_id]
        client.delete(f"/api/rollouts/{generated_id}")
        for answer in (created[0], *found):
            answer["rollout_id"] = "<generated>"
        return httpx.Response(200, json={"created": created, "listed": found})

    answer = same(servers, generated)
    assert answer["created"][0]["config"] == {"timeout_seconds": 3600, "local": None, "k8s": None}
    assert answer["listed"] == answer["created"]


def test_errors_for_what_v1_refuses_have_v1s_status(servers: tuple[str, str, Http]) -> None:
    cases: list[tuple[str, Step, int]] = [
        ("unknown rollout", lambda c, r: c.get(f"/api/rollouts/{r}"), 404),
        ("patch of an unknown rollout", lambda c, r: patch(c, r, state="running"), 404),
        ("events of an unknown rollout", lambda c, r: c.get(f"/api/rollouts/{r}/events"), 404),
        ("event for an unknown rollout", lambda c, r: c.post(f"/api/rollouts/{r}/attempt/0/events", json={"event_type": "x"}), 404),  # noqa: E501
        ("illegal transition", lambda c, r: (create(c, r), patch(c, r, state="succeeded"))[1], 409),
        ("terminal is final", lambda c, r: (create(c, r), patch(c, r, state="failed"), patch(c, r, state="running"))[2], 409),  # noqa: E501
        ("unknown state in a patch", lambda c, r: (create(c, r), patch(c, r, state="paused"))[1], 422),
        ("a field no patch may set", lambda c, r: (create(c, r), patch(c, r, version=7))[1], 422),
        ("unknown state filter", lambda c, r: c.get("/api/rollouts", params={"state_in": "done"}), 422),
        ("no state filter", lambda c, r: c.get("/api/rollouts"), 422),
        ("rollouts body not a list", lambda c, r: c.post("/api/rollouts", json={"input": 1}), 422),
        ("rollout without input", lambda c, r: c.post("/api/rollouts", json=[{"is_train": True}]), 422),
        ("event without event_type", lambda c, r: (create(c, r), c.post(f"/api/rollouts/{r}/attempt/0/events", json={"data": {}}))[1], 422),  # noqa: E501
        ("event data not an object", lambda c, r: (create(c, r), c.post(f"/api/rollouts/{r}/attempt/0/events", json={"event_type": "n", "data": [1]}))[1], 422),  # noqa: E501
        ("models body not a list", lambda c, r: c.post("/api/models", json={"model": MODEL}), 422),
        ("model without endpoint", lambda c, r: c.post("/api/models", json=[{"model": MODEL}]), 422),
        ("pause with a non-integer wait", lambda c, r: c.post("/proxy/pause", json={"retry_after_seconds": "x"}), 422),
        ("call for an unknown rollout", lambda c, r: c.post(f"/proxy/rollout/{r}/attempt/0/mode/train/openai/v1/chat/completions", json={}), 404),  # noqa: E501
        ("call in an unknown mode", lambda c, r: (create(c, r), c.post(f"/proxy/rollout/{r}/attempt/0/mode/eval/openai/v1/chat/completions", json={}))[1], 404),  # noqa: E501
        ("call of an unserved API", lambda c, r: (create(c, r), c.post(f"/proxy/rollout/{r}/attempt/0/mode/train/openai/v1/embeddings", json={}))[1], 404),  # noqa: E501
    ]  # fmt: skip
    for name, step, status in cases:
        v1, agl = both(servers, step)
        assert (v1.status_code, agl.status_code) == (status, status), (name, v1.text, agl.text)
        agent_route = "/proxy/rollout/" in str(agl.request.url) or str(agl.request.url).endswith("/events")
        if status in (404, 409) and not (agent_route and agl.request.method == "POST"):
            assert agl.json() == v1.json(), (name, v1.text, agl.text)  # v1.0's own {"detail": text}
        elif agent_route:  # Difference: the agents' routes answer errors in OpenAI's shape, with v1.0's status.
            assert agl.json()["error"]["message"], (name, agl.text)
    for path in ("/api/rollouts/x", "/api/rollouts/terminal", "/proxy/state"):
        v1, agl = both(servers, lambda c, r, path=path: httpx.get(str(c.base_url).rstrip("/") + path))
        assert agl.status_code == v1.status_code == 401 and agl.json() == v1.json(), path


def test_events_listing_and_triplets_equal_v1s(servers: tuple[str, str, Http]) -> None:
    def events(client: httpx.Client, rollout_id: str) -> httpx.Response:
        create(client, rollout_id)
        url = f"/api/rollouts/{rollout_id}/attempt/0/events"
        posted = [
            client.post(url, json={"event_type": "reward", "data": {"value": 0.5, "message": "m", "source": "s"}}),
            client.post(url, json={"event_type": "note", "data": {"nested": {"a": [1, None, "x"]}}}),
            client.post(url, json={"event_type": "reward", "data": {"value": 1, "reason": "r", "extra": True}}),
        ]
        listing = client.get(f"/api/rollouts/{rollout_id}/events").json()
        rewards = client.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "reward"}).json()
        triplet = client.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
        other = client.get(f"/api/rollouts/{rollout_id}/events", params={"format": "raw"}).json()
        answers = {"posted": [p.json() for p in posted], "listing": listing, "rewards": rewards, "other": other}
        answers["triplet"] = triplet
        return httpx.Response(200, json=answers)

    v1, agl = both(servers, events)
    v1_answer, agl_answer = v1.json(), agl.json()
    for key in ("posted", "listing", "rewards", "other"):
        assert normal(agl_answer[key]) == normal(v1_answer[key]), key
    # Difference: the ledger's triplet view leaves out events other than model_request and reward (v1.0 passed them
    # through untrimmed); the rewards are trimmed alike.
    assert [e for e in normal(v1_answer["triplet"]) if e["event_type"] == "reward"] == normal(agl_answer["triplet"])
    assert [e["event_type"] for e in v1_answer["triplet"]] == ["reward", "note", "reward"]


def test_a_call_v1s_gateway_records_reads_back_alike_from_agl(servers: tuple[str, str, Http]) -> None:
    """One chat call through each gateway to the same deterministic engine; then v1.0's recorded event, posted into
    AGL as it is (item 3: an importer), gives AGL's triplet of its own recorded call, and v1.0's triplet."""
    v1_url, agl_url, _ = servers
    body = {"model": "anything", "messages": [{"role": "user", "content": "What is 6 * 7?"}], "max_tokens": 16}
    recorded, triplets = {}, {}
    rollout_ids = {}
    for name, url in (("v1", v1_url), ("agl", agl_url)):
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
            rollout_id = uuid.uuid4().hex
            rollout_ids[name] = rollout_id
            create(client, rollout_id)
            patch(client, rollout_id, state="running", last_attempt_id="0")
            call = client.post(
                f"/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1/chat/completions", json=body
            )
            assert call.status_code == 200, call.text
            (recorded[name],) = client.get(f"/api/rollouts/{rollout_id}/events").json()
            (triplets[name],) = client.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
    v1_call, agl_call = recorded["v1"]["data"], recorded["agl"]["data"]
    # The engine saw the same request from both (model, temperature, token ids and log-probs forced alike).
    for key in ("model", "temperature", "return_token_ids", "logprobs", "messages", "max_tokens"):
        assert agl_call["request"][key] == v1_call["request"][key], key
    clock = {"id": "", "created": 0}  # the engine's call id and clock differ between the two calls
    assert {**agl_call["response"], **clock} == {**v1_call["response"], **clock}
    common = ("prompt_token_ids", "response_token_ids", "response_log_probs", "server", "status")
    v1_triplet, agl_triplet = triplets["v1"]["data"], triplets["agl"]["data"]
    assert {k: agl_triplet[k] for k in common} == {k: v1_triplet[k] for k in common}
    assert v1_triplet["response_token_ids"] and v1_triplet["response_log_probs"]

    # v1.0's recorded event, imported into AGL in v1.0's shape, reads back as v1.0's triplet.
    with httpx.Client(base_url=agl_url, headers=AUTH, timeout=30) as client:
        imported = uuid.uuid4().hex
        create(client, imported)
        posted = client.post(f"/api/rollouts/{imported}/attempt/0/events", json={"event_type": "model_request",
                                                                               "data": v1_call})  # fmt: skip
        assert posted.status_code == 200, posted.text
        (triplet,) = client.get(f"/api/rollouts/{imported}/events", params={"format": "triplet"}).json()
    assert {k: triplet["data"][k] for k in common} == {k: v1_triplet[k] for k in common}


def test_gateway_management_and_health_equal_v1s(servers: tuple[str, str, Http]) -> None:
    def management(client: httpx.Client, rollout_id: str) -> httpx.Response:
        answers = [client.get("/proxy/state")]
        answers.append(client.post("/proxy/pause", json={"reason": "update", "retry_after_seconds": 9}))
        answers.append(client.get("/proxy/state"))
        answers.append(client.post("/proxy/pause", json={}))  # v1.0's defaults: 5 s, no reason
        answers.append(client.post("/proxy/resume"))
        answers.append(client.get("/proxy/state"))
        answers.append(httpx.get(str(client.base_url).rstrip("/") + "/healthz"))
        return httpx.Response(200, json=[[a.status_code, a.json()] for a in answers])

    answers = same(servers, management)
    assert answers[1] == [200, {"paused": True, "retry_after_seconds": 9, "reason": "update", "inflight": 0}]
    assert answers[3][1]["retry_after_seconds"] == 5 and answers[3][1]["reason"] is None
    assert answers[-1] == [200, {"status": "ok"}]


def test_known_differences_are_what_the_readme_says(servers: tuple[str, str, Http]) -> None:
    """Each deliberate difference, with both answers checked."""
    # running -> running: v1.0 refuses it (409); AGL changes fields along it (a running attempt's new handle).
    v1, agl = both(servers, lambda c, r: (create(c, r), patch(c, r, state="running"), patch(c, r, state="running"))[2])
    assert (v1.status_code, agl.status_code) == (409, 200)
    # An event after the end: v1.0 stores it; AGL refuses it (what a trainer has read never changes).
    v1, agl = both(
        servers,
        lambda c, r: (
            create(c, r),
            patch(c, r, state="failed"),
            c.post(f"/api/rollouts/{r}/attempt/0/events", json={"event_type": "note"}),
        )[2],
    )
    assert (v1.status_code, agl.status_code) == (200, 409)
    # An attempt other than "0": v1.0 files the event under whatever attempt the URL names; AGL only under one the
    # rollout has (404: nothing is stored under an attempt no controller started).
    v1, agl = both(
        servers, lambda c, r: (create(c, r), c.post(f"/api/rollouts/{r}/attempt/7/events", json={"event_type": "n"}))[1]
    )
    assert (v1.status_code, agl.status_code) == (200, 404) and "7" in agl.json()["error"]["message"]
    # A PATCH without `state` on a queued rollout: v1.0 applies it; the ledger changes fields along a transition only.
    v1, agl = both(servers, lambda c, r: (create(c, r), patch(c, r, error_message="note"))[1])
    assert (v1.status_code, agl.status_code) == (200, 409)
    # A call on a finished rollout: v1.0 forwards and records it; AGL refuses it before any engine time is spent.
    chat = "/attempt/0/mode/train/openai/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]}
    v1, agl = both(
        servers,
        lambda c, r: (create(c, r), patch(c, r, state="failed"), c.post(f"/proxy/rollout/{r}{chat}", json=body))[2],
    )
    assert (v1.status_code, agl.status_code) == (200, 409)
    # Streaming: v1.0 refuses it (400); AGL streams (a superset).
    v1, agl = both(
        servers, lambda c, r: (create(c, r), c.post(f"/proxy/rollout/{r}{chat}", json={**body, "stream": True}))[1]
    )
    assert v1.status_code == 400 and agl.status_code == 200 and agl.text.rstrip().endswith("data: [DONE]")
    # Ids: v1.0 takes any string; AGL only [A-Za-z0-9_.-] (they appear unescaped in URLs, Job names, logs).
    v1, agl = both(servers, lambda c, r: create(c, r + " x"))
    assert (v1.status_code, agl.status_code) == (201, 422) and "rollout_id" in agl.json()["detail"]
    # A cursor ahead of the completion log (a ledger that was reset): v1.0 answers an empty page, forever; AGL 422.
    v1, agl = both(servers, lambda c, r: c.get("/api/rollouts/terminal", params={"after": 10**9}))
    assert (v1.status_code, agl.status_code) == (200, 422) and "start over" in agl.json()["detail"]
    assert v1.json()["items"] == [] and v1.json()["next_after"] == 10**9
    # A refused body: v1.0 (FastAPI) lists pydantic's errors, AGL one sentence naming the field.
    v1, agl = both(servers, lambda c, r: c.post("/api/rollouts", json=[{"is_train": True}]))
    assert isinstance(v1.json()["detail"], list) and "input" in agl.json()["detail"]


def test_the_terminal_cursor_pages_as_v1s(servers: tuple[str, str, Http]) -> None:
    """Completion order (not creation order), a deleted rollout skipped but counted in the cursor and the total,
    `limit` and `next_after` as in v1.0."""

    def pages(client: httpx.Client, rollout_id: str) -> httpx.Response:
        start = client.get("/api/rollouts/terminal", params={"after": 0, "limit": 1}).json()["total_terminal"]
        ids = [f"{rollout_id}-{k}" for k in range(3)]
        for rid in ids:
            create(client, rid)
            patch(client, rid, state="running")
        for rid, state in ((ids[1], "succeeded"), (ids[0], "failed"), (ids[2], "succeeded")):
            patch(client, rid, state=state)
        client.delete(f"/api/rollouts/{ids[0]}")
        answers = []
        after = start
        for _ in range(3):
            page = client.get("/api/rollouts/terminal", params={"after": after, "limit": 2}).json()
            answers.append(
                {**page, "next_after": page["next_after"] - start, "total_terminal": page["total_terminal"] - start}
            )
            after = page["next_after"]
        return httpx.Response(200, json=answers)

    answers = same(servers, pages)
    assert [[i["state"] for i in page["items"]] for page in answers] == [["succeeded"], ["succeeded"], []]
    assert [page["next_after"] for page in answers] == [2, 3, 3]
    assert all(page["total_terminal"] == 3 for page in answers)


def test_model_call_refusals_have_v1s_status(servers: tuple[str, str, Http]) -> None:
    """A body that is not JSON or not an object is 400, no engine for the model is 503, on both."""
    chat = "/attempt/0/mode/train/openai/v1/chat/completions"

    def post(client: httpx.Client, rollout_id: str, content: bytes) -> httpx.Response:
        create(client, rollout_id)
        return client.post(f"/proxy/rollout/{rollout_id}{chat}", content=content)

    for content in (b"{not json", b"[1, 2]"):
        v1, agl = both(servers, lambda c, r, content=content: post(c, r, content))
        assert (v1.status_code, agl.status_code) == (400, 400), (content, v1.text, agl.text)
    v1_url, agl_url, engine = servers
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        for url in (v1_url, agl_url):
            assert httpx.delete(f"{url}/api/models", headers=AUTH).json() == {"status": "ok"}
        deadline = time.monotonic() + 10
        while True:  # the proxy follows the registry's stream: it sees the endpoint go within moments
            v1, agl = both(servers, lambda c, r: post(c, r, body))
            if agl.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (v1.status_code, agl.status_code) == (503, 503), (v1.text, agl.text)
    finally:
        for url in (v1_url, agl_url):
            models = [{"model": MODEL, "endpoint": f"{engine.url}/v1"}]
            assert httpx.post(f"{url}/api/models", json=models, headers=AUTH).status_code == 201
        deadline = time.monotonic() + 10
        while not httpx.get(f"{agl_url}/status").json()["endpoints"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the next test finds the engine routed again
