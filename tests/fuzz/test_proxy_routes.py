"""Every proxy route fed generated bodies and headers: JSON of any shape, plausible model calls with hostile
values, junk bytes, invalid UTF-8, deep nesting, odd content types and keys. No answer is a 5xx other than the
documented 503 (ledger unavailable, no endpoint), the proxy stays up, and the ledger's state stays consistent."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services._gen.agl.v1 import rollout_pb2
from services.client import agent_token
from tests.proxy.conftest import MODEL, Http, ledger_call
from tests.support.procs import ServiceProcess

from . import tally
from .conftest import FUZZ_KEY
from .consistency import check_ledger
from .strategies import DEEP_JSON, NASTY_IDS, json_values, texts

ATTEMPT = "at-1"

messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "", "x"]) | texts},
        optional={"content": texts | json_values, "name": texts},
    ),
    max_size=4,
)
plausible_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": texts}),
    min_size=1,
    max_size=3,
)
model_call_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": plausible_messages, "prompt": texts, "input": texts},
    optional={"max_tokens": st.integers(1, 16), "stream": st.booleans(), "temperature": st.floats(0, 2)},
)
hostile_model_call_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "", "other"]) | texts,
        "messages": messages | json_values,
        "prompt": texts | json_values,
        "input": texts | json_values,
        "max_tokens": st.integers(-5, 40) | json_values,
        "max_output_tokens": st.integers(-5, 40),
        "temperature": st.floats(allow_nan=False) | json_values,
        "stream": st.booleans() | json_values,
        "n": st.integers(-2, 3),
        "logprobs": json_values,
        "tools": json_values,
        "system": texts | json_values,
    },
)
event_bodies = st.fixed_dictionaries(
    {},
    optional={
        "event_type": st.sampled_from(["reward", "rewrd", "note", "model_request", ""]) | texts | json_values,
        "data": st.fixed_dictionaries({}, optional={"value": st.floats() | json_values}) | json_values,
        "event_id": texts | json_values,
    },
)


def _encoded(value: object) -> bytes:
    return json.dumps(value).encode()


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.just(DEEP_JSON.encode()),
    st.just(b'{"messages": "\xff\xfe"}'),
    st.just(b'{"model": NaN}'),
    json_values.map(_encoded),
)
content_types = st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1", "x/\x7f"])


@pytest.fixture(scope="module")
def rollout(ledger: ServiceProcess) -> str:
    rollout_id = f"ro-fuzz-{uuid.uuid4().hex[:8]}"
    spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
    ledger_call(ledger.address, "create_rollouts", [spec])
    ledger_call(ledger.address, "update_status", rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id=ATTEMPT)
    return rollout_id


@pytest.fixture(scope="module")
def http(proxy: Http) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module", autouse=True)
def consistent_afterwards(ledger: ServiceProcess, proxy: Http) -> Iterator[None]:
    yield
    assert proxy.process.alive(), proxy.process.log_text()[-4000:]
    print(f"ledger consistent after fuzzing the proxy: {check_ledger(ledger, FUZZ_KEY)}")


def keys(rollout_id: str) -> st.SearchStrategy[dict[str, str]]:
    token = agent_token(FUZZ_KEY, rollout_id, ATTEMPT)
    wrong = agent_token(FUZZ_KEY, rollout_id, "at-2")
    bearer = st.sampled_from([FUZZ_KEY, token, wrong, "", "nope", "é", token + "x"]) | texts
    return st.one_of(
        st.just({}),
        bearer.map(lambda k: {"authorization": f"Bearer {k}"}),
        bearer.map(lambda k: {"x-api-key": k}),
        texts.map(lambda k: {"authorization": k}),
    )


def check(target: str, reply: httpx.Response) -> None:
    answer = str(reply.status_code)
    if reply.status_code >= 400 and reply.headers.get("content-type", "").startswith("application/json"):
        error = reply.json().get("error")
        code = error.get("code") or error.get("type") if isinstance(error, dict) else None
        answer += f" {code}" if isinstance(code, str) else ""
    tally.tried(target, answer)
    if reply.status_code >= 500 and reply.status_code != 503:
        tally.FAILED[target] += 1
        raise AssertionError(f"{target}: {reply.status_code} {reply.text[:500]}")
    if reply.status_code >= 400 and reply.headers.get("content-type", "").startswith("application/json"):
        assert "error" in reply.json() or "detail" in reply.json() or "type" in reply.json(), reply.text


def _safe_headers(headers: dict[str, str]) -> dict[str, bytes]:
    """The headers as bytes (latin-1, so bytes over 0x7f get through), less what HTTP/1.1 cannot carry at all."""
    sendable = {}
    for name, value in headers.items():
        value = value.strip(" \t")
        try:
            raw = value.encode("latin-1")
        except UnicodeEncodeError:
            continue
        if not any(byte in raw for byte in b"\r\n\x00") and not any(b < 0x20 and b != 0x09 for b in raw):
            sendable[name] = raw
    return sendable


MODEL_ROUTES = ["chat/completions", "completions", "messages", "responses"]


@pytest.mark.parametrize("route", MODEL_ROUTES)
def test_model_call_routes(http: httpx.Client, rollout: str, route: str) -> None:
    base = f"/proxy/rollout/{rollout}/attempt/{ATTEMPT}/mode"

    # Authorized (keys are fuzzed by the tests below and in test_agent_tokens), so that the generated bodies get
    # past the door: mostly well-formed JSON with hostile values, the rest junk.
    @given(
        body=st.one_of(model_call_bodies.map(_encoded), hostile_model_call_bodies.map(_encoded), raw_bodies),
        headers=st.dictionaries(st.sampled_from(["x-api-key", "accept", "accept-encoding", "x-request-id"]), texts),
        content_type=content_types,
        mode=st.sampled_from(["train", "val", "x"]),
    )
    def run(body: bytes, headers: dict[str, str], content_type: str, mode: str) -> None:
        headers = {**headers, "authorization": f"Bearer {FUZZ_KEY}", "content-type": content_type}
        sent = _safe_headers(headers)
        check(f"proxy POST .../{route}", http.post(f"{base}/{mode}/openai/v1/{route}", content=body, headers=sent))

    run()


def test_events_route(http: httpx.Client, rollout: str) -> None:
    @given(body=st.one_of(event_bodies.map(_encoded), raw_bodies), headers=keys(rollout), content_type=content_types)
    def run(body: bytes, headers: dict[str, str], content_type: str) -> None:
        sent = _safe_headers({**headers, "content-type": content_type})
        path = f"/api/rollouts/{rollout}/attempt/{ATTEMPT}/events"
        check("proxy POST .../events", http.post(path, content=body, headers=sent))

    run()


def test_paths_with_hostile_ids(http: httpx.Client, rollout: str) -> None:
    ids = st.sampled_from(NASTY_IDS) | texts

    @given(rollout_id=ids, attempt_id=ids, headers=keys(rollout), tail=st.sampled_from([*MODEL_ROUTES, "models"]))
    def run(rollout_id: str, attempt_id: str, headers: dict[str, str], tail: str) -> None:
        path = f"/proxy/rollout/{quote(rollout_id, safe='')}/attempt/{quote(attempt_id, safe='')}/mode/train"
        path += f"/openai/v1/{tail}"
        method = "GET" if tail == "models" else "POST"
        reply = http.request(method, path, json={"model": MODEL, "messages": []}, headers=_safe_headers(headers))
        check("proxy .../{hostile ids}/...", reply)
        events = f"/api/rollouts/{quote(rollout_id, safe='')}/attempt/{quote(attempt_id, safe='')}/events"
        reply = http.post(events, json={"event_type": "note", "data": {}}, headers=_safe_headers(headers))
        check("proxy POST /api/rollouts/{hostile ids}/.../events", reply)

    run()


REST = [
    ("POST", "/api/rollouts"),
    ("GET", "/api/rollouts"),
    ("GET", "/api/rollouts/terminal"),
    ("GET", "/api/rollouts/{id}"),
    ("PATCH", "/api/rollouts/{id}"),
    ("DELETE", "/api/rollouts/{id}"),
    ("GET", "/api/rollouts/{id}/events"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/admin/state"),
]


@pytest.mark.parametrize(("method", "route"), REST, ids=[f"{m} {r}" for m, r in REST])
def test_rest_and_service_routes_with_the_master_key(http: httpx.Client, method: str, route: str) -> None:
    """With the master key: the v1.0 store routes on ids that are not the fuzz rollout's (so no run is disturbed)."""

    @given(
        body=json_values.map(_encoded) | raw_bodies,
        rollout_id=st.sampled_from(NASTY_IDS[1:]) | texts.filter(bool),
        query=st.dictionaries(st.sampled_from(["after", "limit", "format", "status", "x"]), texts, max_size=3),
    )
    def run(body: bytes, rollout_id: str, query: dict[str, str]) -> None:
        path = route.replace("{id}", quote(f"fz-{rollout_id}", safe=""))
        headers = {"authorization": f"Bearer {FUZZ_KEY}", "content-type": "application/json"}
        content = body if method in ("POST", "PATCH") else None
        check(f"proxy {method} {route}", http.request(method, path, content=content, params=query, headers=headers))

    run()


ADMIN_AND_MODELS = [
    ("POST", "/admin/pause"),
    ("POST", "/admin/resume"),
    ("POST", "/admin/drain"),
    ("POST", "/api/models"),
    ("DELETE", "/api/models"),
]


@pytest.mark.parametrize(("method", "route"), ADMIN_AND_MODELS, ids=[f"{m} {r}" for m, r in ADMIN_AND_MODELS])
def test_admin_and_model_routes_refuse_anything_but_the_master_key(
    http: httpx.Client, rollout: str, method: str, route: str
) -> None:
    @given(body=json_values.map(_encoded) | raw_bodies, headers=keys(rollout))
    def run(body: bytes, headers: dict[str, str]) -> None:
        sent = _safe_headers(headers)
        master = FUZZ_KEY.encode()
        if master in sent.get("authorization", b"").split() or sent.get("x-api-key", b"").strip() == master:
            sent = {}  # the master key would pause the proxy or change its engines: that is not fuzzed here
        reply = http.request(method, route, content=body, headers=sent)
        check(f"proxy {method} {route} (not master)", reply)
        assert reply.status_code == 401, reply.text

    run()
