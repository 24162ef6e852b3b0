"""Agent tokens never reach another rollout's data: a token of one (rollout, attempt) presented on the routes of
another pair, or on the master-only routes, is refused, and nothing is stored anywhere by such a request."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services._gen.agl.v1 import rollout_pb2
from services.client import agent_token
from tests.proxy.conftest import MODEL, Http, ledger_call
from tests.support.procs import ServiceProcess

from . import tally
from .conftest import FUZZ_KEY
from .consistency import check_ledger

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1?"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def pairs(ledger: ServiceProcess) -> list[tuple[str, str]]:
    """Two running rollouts, each with its attempt."""
    made = []
    for name in ("a", "b"):
        rollout_id = f"ro-tok-{name}-{uuid.uuid4().hex[:6]}"
        spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
        ledger_call(ledger.address, "create_rollouts", [spec])
        ledger_call(
            ledger.address, "update_status", rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id=f"at-{name}"
        )
        made.append((rollout_id, f"at-{name}"))
    return made


@pytest.fixture(scope="module")
def http(proxy: Http) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        yield client


def test_a_token_only_opens_its_own_rollout_and_attempt(
    http: httpx.Client, ledger: ServiceProcess, pairs: list[tuple[str, str]]
) -> None:
    rollouts = [r for r, _ in pairs] + ["ro-tok-missing", pairs[0][0] + "x"]
    attempts = [a for _, a in pairs] + ["at-z", ""]
    accepted: Counter[str] = Counter()

    @given(
        route_rollout=st.sampled_from(rollouts),
        route_attempt=st.sampled_from(attempts[:3]),
        token_rollout=st.none() | st.sampled_from(rollouts),  # None: the route's own (a matching token, often)
        token_attempt=st.none() | st.sampled_from(attempts),
        key_for=st.sampled_from(["FUZZ", "other-master"]),
        kind=st.sampled_from(["event", "chat", "models", "rest"]),
    )
    @settings(max_examples=settings.default.max_examples * 3)
    def run(route_rollout, route_attempt, token_rollout, token_attempt, key_for, kind) -> None:
        token_rollout = route_rollout if token_rollout is None else token_rollout
        token_attempt = route_attempt if token_attempt is None else token_attempt
        token = agent_token(FUZZ_KEY if key_for == "FUZZ" else "other-master", token_rollout, token_attempt)
        headers = {"authorization": f"Bearer {token}"}
        own = key_for == "FUZZ" and (token_rollout, token_attempt) == (route_rollout, route_attempt)
        base = f"/proxy/rollout/{route_rollout}/attempt/{route_attempt}/mode/train/openai/v1"
        if kind == "event":
            body = {"event_type": "note", "data": {"by": f"{token_rollout}/{token_attempt}"}}
            path = f"/api/rollouts/{route_rollout}/attempt/{route_attempt}/events"
            reply = http.post(path, json=body, headers=headers)
        elif kind == "chat":
            reply = http.post(f"{base}/chat/completions", json=CHAT, headers=headers)
        elif kind == "models":
            reply = http.get(f"{base}/models", headers=headers)
        else:  # the v1.0 store routes take the master key only
            reply = http.get(f"/api/rollouts/{route_rollout}", headers=headers)
            own = False
        tally.tried(f"agent token ({kind})", f"{reply.status_code // 100}xx")
        if own and kind == "models":  # the model card of the rollout's model: any attempt, the rollout must exist
            known = route_rollout in {r for r, _ in pairs}
            assert reply.status_code == (200 if known else 404), reply.text
        elif own and (route_rollout, route_attempt) in pairs:
            assert reply.status_code == 200, reply.text
            if kind in ("event", "chat"):
                accepted[route_rollout] += 1
        else:
            if reply.status_code not in (401, 403, 404):
                tally.FAILED[f"agent token ({kind})"] += 1
            assert reply.status_code in (401, 403, 404), (kind, route_rollout, token_rollout, reply.text)

    run()
    # Whatever was stored on each rollout came with its own token: one event per accepted request, each note
    # written by that rollout's own pair, and every event on the rollout's own attempt.
    for rollout_id, attempt_id in pairs:
        events = ledger_call(ledger.address, "list_events", rollout_id, attempt_id="*")
        assert len(events) == accepted[rollout_id], (rollout_id, [e.event_type for e in events])
        assert all(e.attempt_id == attempt_id for e in events)
        for event in events:
            if event.event_type == "note":
                assert f"{rollout_id}/{attempt_id}" in event.data_json
    print(f"agent tokens: accepted {dict(accepted)}; ledger {check_ledger(ledger, FUZZ_KEY)}")
