"""The ledger's ABORTED (a compare-and-set that lost to a concurrent writer) means one thing at the proxy: 409
conflict, on the agents' routes and on v1.0's REST routes alike, never the 503 that tells a client to retry later.

The proxy sends no expected version today, so a real ledger answers it ABORTED only when a read meets a concurrent
writer; the ledger here is the real core, servicer and gRPC server (in a thread of the test, on loopback) whose reads
of `lost-cas-*` rollouts raise the core's own `Aborted`, as such a read would."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import grpc
import httpx

from services._gen.agl.v1 import rollout_pb2
from services.ledger.errors import Aborted
from services.ledger.ledger import Ledger
from services.ledger.memory_store import MemoryStore
from services.ledger.servicer import LedgerServicer

from .conftest import AUTH, MODEL, base_url, run_proxy

LOST = "lost-cas-"


class _RacedLedger(Ledger):
    """A real ledger whose every read of a `lost-cas-*` rollout loses to a concurrent writer."""

    async def get_rollout(self, rollout_id: str) -> rollout_pb2.Rollout:
        if rollout_id.startswith(LOST):
            raise Aborted(f"rollout {rollout_id}: version is 3, expected 2")
        return await super().get_rollout(rollout_id)


@contextlib.contextmanager
def raced_ledger() -> Iterator[str]:
    """Serves a _RacedLedger on loopback from its own thread and event loop; yields its address."""
    ready = threading.Event()
    bound: dict[str, object] = {}

    async def serve() -> None:
        ledger = _RacedLedger(MemoryStore())
        ledger.load()
        server = grpc.aio.server()
        LedgerServicer(ledger).register(server)
        bound["port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = asyncio.Event()
        bound["stop"] = (asyncio.get_running_loop(), stop)
        ready.set()
        await stop.wait()
        await server.stop(0)
        await ledger.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the in-thread ledger did not start"
    try:
        yield f"127.0.0.1:{bound['port']}"
    finally:
        loop, stop = bound["stop"]  # type: ignore[misc]
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def test_aborted_is_409_conflict_in_both_dialects() -> None:
    rollout_id = f"{LOST}r1"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with raced_ledger() as address, run_proxy(address) as proxy:
        call = httpx.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=chat, headers=AUTH, timeout=10)
        assert call.status_code == 409, call.text
        assert call.json()["error"]["code"] == "conflict" and "expected 2" in call.json()["error"]["message"]

        url = f"{proxy.url}/api/rollouts/{rollout_id}"
        read = httpx.get(url, headers=AUTH, timeout=10)
        assert read.status_code == 409 and "expected 2" in read.json()["detail"]
        claim = httpx.patch(url, json={"status": {"state": "running"}}, headers=AUTH, timeout=10)
        assert claim.status_code == 409 and "expected 2" in claim.json()["detail"]
