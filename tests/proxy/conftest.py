"""Real ledger, real proxy processes and stand-in engines on loopback, shared per test module."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from services._gen.agl.v1 import model_pb2, rollout_pb2
from services.client import LedgerClient
from tests.support.procs import ServiceProcess, free_port, start_ledger, start_service, wait_http_ready

KEY = "proxy-test-master-key"
MODEL = "toy-model"


@dataclass
class Http:
    """A started HTTP service and its base URL."""

    process: ServiceProcess
    url: str


@contextlib.contextmanager
def run_standin(model: str = MODEL, args: Sequence[str] = (), port: int = 0) -> Iterator[Http]:
    port = port or free_port()
    argv = [sys.executable, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(port), "--model", model]
    url = f"http://127.0.0.1:{port}"
    with start_service(
        [*argv, *args], name="standin", port=port, ready=lambda _: wait_http_ready(f"{url}/health")
    ) as process:
        yield Http(process, url)


@contextlib.contextmanager
def run_proxy(ledger: str, key: str | None = KEY, args: Sequence[str] = ()) -> Iterator[Http]:
    port = free_port()
    argv = [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(port), "--ledger", ledger]
    argv += ["--model-name", MODEL, "--heartbeat", "0.5", "--retry-initial-backoff", "0.02", *args]
    env = {"AGL_KEY": key} if key else {}
    url = f"http://127.0.0.1:{port}"
    with start_service(
        argv, name="proxy", port=port, env=env, ready=lambda _: wait_http_ready(f"{url}/healthz")
    ) as process:
        yield Http(process, url)


def ledger_call(address: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One LedgerClient call from synchronous code (fixtures)."""

    async def call() -> Any:
        async with LedgerClient(address, KEY) as client:
            return await getattr(client, method)(*args, **kwargs)

    return asyncio.run(call())


def model_endpoints(*engines: Http, version: int = 1) -> list[model_pb2.ModelEndpoint]:
    return [model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{e.url}/v1", version=version) for e in engines]


def register(address: str, *engines: Http, version: int = 1) -> None:
    """Registers engines from synchronous code (fixtures); async tests call register_models themselves."""
    ledger_call(address, "register_models", model_endpoints(*engines, version=version))


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def engine(ledger: ServiceProcess) -> Iterator[Http]:
    with run_standin() as standin:
        register(ledger.address, standin)
        yield standin


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    with run_proxy(ledger.address) as process:
        yield process


@pytest.fixture
async def client(ledger: ServiceProcess) -> Any:
    async with LedgerClient(ledger.address, KEY) as ledger_client:
        yield ledger_client


async def new_rollout(client: LedgerClient, attempt_id: str = "at-1", rollout_id: str = "") -> str:
    """A running rollout with the given attempt, as the controller would leave it."""
    rollout_id = rollout_id or f"ro-{uuid.uuid4().hex[:12]}"
    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id=attempt_id)
    return rollout_id


def base_url(proxy: Http, rollout_id: str, attempt_id: str = "at-1", mode: str = "train") -> str:
    return f"{proxy.url}/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"


def event_url(proxy: Http, rollout_id: str, attempt_id: str = "at-1") -> str:
    return f"{proxy.url}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"


def engine_requests(engine: Http) -> dict[str, Any]:
    return httpx.get(f"{engine.url}/standin/requests").json()


def set_engine(engine: Http, **knobs: Any) -> None:
    httpx.post(f"{engine.url}/standin/config", json=knobs).raise_for_status()


AUTH = {"authorization": f"Bearer {KEY}"}
