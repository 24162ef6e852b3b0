"""The adversarial probe of issue 17, re-run against real proxy processes: each attack must now be refused cleanly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from services.client import agent_token
from tests.support.procs import ServiceProcess
from tests.support.slow_clients import check_all_closed, fate

from .conftest import AUTH, KEY, MODEL, Http, base_url, engine_requests, event_url, new_rollout, run_proxy

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
REWARD = {"event_type": "reward", "data": {"value": 1.0}}
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: a\r\n"  # and then nothing: the head never ends


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def chat(proxy: Http, rollout_id: str, attempt_id: str, **kwargs: object) -> httpx.Response:
    url = f"{base_url(proxy, rollout_id, attempt_id)}/chat/completions"
    return httpx.post(url, **kwargs)  # type: ignore[arg-type]


def assert_openai_error(reply: httpx.Response, status: int) -> dict[str, str]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    return reply.json()["error"]


async def test_token_of_one_pair_is_not_valid_for_a_pair_that_once_shared_its_encoding(proxy, client) -> None:
    """HMAC over "{rollout}:{attempt}" made (c1:x, A) and (c1, x:A) share a token; the encoding is now unambiguous."""
    assert agent_token(KEY, "c1:x", "A") != agent_token(KEY, "c1", "x:A")
    assert agent_token(KEY, "ab", "c") != agent_token(KEY, "a", "bc")
    rollout = await new_rollout(client, attempt_id="x")
    forged = {"authorization": f"Bearer {agent_token(KEY, f'{rollout}:x', 'A')}"}
    assert_openai_error(chat(proxy, rollout, "x:A", json=CHAT, headers=forged), 401)
    assert_openai_error(httpx.post(event_url(proxy, rollout, "x:A"), json=REWARD, headers=forged), 401)
    assert await client.list_events(rollout, attempt_id="*") == []


async def test_calls_and_events_on_an_attempt_the_rollout_never_had_are_404(proxy, engine, client) -> None:
    rollout = await new_rollout(client, attempt_id="at-1")
    calls_before = engine_requests(engine)["requests"]
    error = assert_openai_error(httpx.post(event_url(proxy, rollout, "bogus-att"), json=REWARD, headers=AUTH), 404)
    assert "bogus-att" in error["message"]
    error = assert_openai_error(chat(proxy, rollout, "bogus-att", json=CHAT, headers=AUTH), 404)
    assert "bogus-att" in error["message"]
    token = {"authorization": f"Bearer {agent_token(KEY, rollout, 'bogus-att')}"}  # a valid token does not help
    assert_openai_error(httpx.post(event_url(proxy, rollout, "bogus-att"), json=REWARD, headers=token), 404)
    assert engine_requests(engine)["requests"] == calls_before  # no engine time spent
    assert await client.list_events(rollout, attempt_id="*") == []
    assert chat(proxy, rollout, "at-1", json=CHAT, headers=AUTH).status_code == 200


@pytest.mark.parametrize("depth", [300, 1_000, 5_000])
async def test_deeply_nested_model_calls_are_400_json(proxy, client, depth: int) -> None:
    rollout = await new_rollout(client)
    body = {**CHAT, "extra": nested(depth)}
    text = httpx.Request("POST", "http://x", json=body).read() if depth < 900 else None
    content = text or (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": ' + b"[" * depth)
    content += b"]" * depth + b"}" if text is None else b""
    error = assert_openai_error(chat(proxy, rollout, "at-1", content=content, headers=AUTH), 400)
    assert "nested" in error["message"] or "JSON" in error["message"]


@pytest.mark.parametrize("depth", [1_100, 50_000])
async def test_deeply_nested_events_are_refused_not_500(proxy, client, depth: int) -> None:
    rollout = await new_rollout(client)
    # An object 252 levels deep, as deep as v1.0's listing writes.
    content = b'{"event_type": "note", "data": {"a": ' + b"[" * 251 + b"]" * 251 + b"}}"
    assert httpx.post(event_url(proxy, rollout), content=content, headers=AUTH).status_code == 200
    content = b'{"event_type": "note", "data": {"a": ' + b"[" * depth + b"]" * depth + b"}}"
    reply = httpx.post(event_url(proxy, rollout), content=content, headers=AUTH)
    assert reply.status_code in (400, 422), reply.text
    assert "nested" in reply.json()["error"]["message"]


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
async def test_non_ascii_keys_are_401_not_500(proxy, client, header: str) -> None:
    rollout = await new_rollout(client)
    value = b"Bearer \xe9" if header == "authorization" else b"\xe9\xff"
    assert_openai_error(chat(proxy, rollout, "at-1", json=CHAT, headers={header: value}), 401)
    assert_openai_error(httpx.post(event_url(proxy, rollout), json=REWARD, headers={header: value}), 401)
    assert_openai_error(httpx.get(f"{proxy.url}/admin/state", headers={header: value}), 401)


# -- slow and idle clients ---------------------------------------------------------------------------------------

SLOW_CONNECTIONS = 300
CAP = 100


@pytest.fixture(scope="module")
def guarded_proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    args = ["--max-client-connections", str(CAP), "--header-timeout", "1", "--body-timeout", "1"]
    with run_proxy(ledger.address, args=args) as process:
        yield process


async def _open_slow(url: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    pairs = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(SLOW_HEAD)
        pairs.append((reader, writer))
    return pairs


async def test_slow_header_connections_neither_starve_agents_nor_stay_open(guarded_proxy, client) -> None:
    """Three times the cap of connections that never finish their head: the proxy still answers /healthz and a real
    model call, and every slow connection is closed (408 at its deadline, or 503 / displaced above the cap)."""
    rollout = await new_rollout(client)
    slow = await _open_slow(guarded_proxy.url, SLOW_CONNECTIONS)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            health = await http.get(f"{guarded_proxy.url}/healthz")
            assert health.status_code == 200
            call = await http.post(f"{base_url(guarded_proxy, rollout)}/chat/completions", json=CHAT, headers=AUTH)
            assert call.status_code == 200 and call.json()["choices"]
        started = time.monotonic()
        fates = await asyncio.gather(*(fate(reader, 5.0) for reader, _ in slow))
        assert time.monotonic() - started < 8
    finally:
        for _, writer in slow:
            writer.close()
    check_all_closed(fates, "AGL_PROXY_HEADER_TIMEOUT")


async def test_a_body_that_never_completes_is_timed_out(guarded_proxy, client) -> None:
    rollout = await new_rollout(client)
    host, port = guarded_proxy.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    path = base_url(guarded_proxy, rollout).removeprefix(guarded_proxy.url) + "/chat/completions"
    head = f"POST {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n"
    writer.write(head.encode() + b'{"model": ')
    try:
        answer = await fate(reader, 5.0)
    finally:
        writer.close()
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert await client.list_events(rollout) == []


async def test_above_the_cap_with_no_idle_connection_new_ones_get_a_clear_503(guarded_proxy, engine, client) -> None:
    """When every connection has a request in progress, a new one is refused at once with 503 and Retry-After."""
    from .conftest import set_engine

    rollout = await new_rollout(client)
    set_engine(engine, delay_ms=3000)
    try:
        async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_connections=CAP + 10)) as http:
            url = f"{base_url(guarded_proxy, rollout)}/chat/completions"
            busy = [asyncio.ensure_future(http.post(url, json=CHAT, headers=AUTH)) for _ in range(CAP)]
            await asyncio.sleep(1.5)  # all CAP calls are in progress at the engine
            async with httpx.AsyncClient(timeout=5) as other:
                refused = await other.get(f"{guarded_proxy.url}/healthz")
            error = assert_openai_error(refused, 503)
            assert error["code"] == "too_many_connections" and refused.headers["retry-after"] == "1"
            done = await asyncio.gather(*busy)
            assert all(r.status_code == 200 for r in done)
    finally:
        set_engine(engine, delay_ms=0)
    async with httpx.AsyncClient(timeout=5) as other:
        assert (await other.get(f"{guarded_proxy.url}/healthz")).status_code == 200
