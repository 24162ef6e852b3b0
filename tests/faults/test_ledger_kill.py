"""kill -9 of the ledger (SQLite) while agents call and rollouts finish, then a restart on the same store: 0
acknowledged events lost, the terminal watch resumes with 0 loss and 0 duplicates, and the proxy and the ledger
clients reconnect by themselves."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from tests.proxy.conftest import KEY, model_endpoints, new_rollout, run_proxy, run_standin
from tests.support.procs import start_ledger

from .calls import Answer, call_loop
from .figures import report


async def _setup(address: str, engine) -> list[str]:
    async with LedgerClient(address, KEY) as client:
        await client.register_models(model_endpoints(engine))
        return [await new_rollout(client) for _ in range(4)]


class Finisher:
    """Creates rollouts and runs them to SUCCEEDED one after another (retrying through the outage), and follows the
    terminal watch from its start; what was acknowledged and what was delivered are kept for the checks."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.acknowledged: list[str] = []
        self.delivered: list[str] = []
        self.stop = threading.Event()

    async def _finish(self, client: LedgerClient) -> None:
        index = 0
        while not self.stop.is_set():
            rollout_id = f"ro-fin-{index:04d}"
            try:
                spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
                await client.create_rollouts([spec])
                current = (await client.get_rollout(rollout_id)).status.state
                if current == rollout_pb2.ROLLOUT_STATE_QUEUING:
                    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
                    current = rollout_pb2.ROLLOUT_STATE_RUNNING
                if current == rollout_pb2.ROLLOUT_STATE_RUNNING:
                    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
                self.acknowledged.append(rollout_id)
                index += 1
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)  # the ledger is away: the same rollout again (create is idempotent)
                continue
            await asyncio.sleep(0.05)

    async def _watch(self, client: LedgerClient) -> None:
        async for entry in client.watch_terminal(labels={}, include_events=False):
            if entry.rollout.rollout_id.startswith("ro-fin-"):
                self.delivered.append(entry.rollout.rollout_id)

    async def run(self) -> None:
        async with LedgerClient(self.address, KEY, call_timeout_s=2.0) as client:
            watcher = asyncio.create_task(self._watch(client))
            await self._finish(client)
            deadline = time.monotonic() + 20
            while set(self.acknowledged) - set(self.delivered) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


async def _ok_events(address: str, rollout_ids: list[str]) -> dict[str, int]:
    async with LedgerClient(address, KEY) as client:
        counts = {}
        for rollout_id in rollout_ids:
            events = await client.list_events(rollout_id, event_type="model_request")
            counts[rollout_id] = sum(1 for e in events if e.model_request.status == event_pb2.MODEL_REQUEST_STATUS_OK)
        return counts


def test_ledger_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    timeline: list[tuple[float, Answer]] = []
    origin = time.monotonic()
    with start_ledger(store=store, key=KEY) as ledger, run_standin() as engine:
        rollouts = asyncio.run(_setup(ledger.address, engine))
        with run_proxy(ledger.address, args=["--ledger-timeout", "3"]) as proxy:
            stop = threading.Event()
            result: list[Answer] = []

            def record(answer: Answer) -> None:
                timeline.append((time.monotonic() - origin, answer))

            def agents() -> None:
                result.extend(call_loop(proxy.url, rollouts, stop, on_answer=record))

            finisher = Finisher(ledger.address)
            threads = [threading.Thread(target=agents), threading.Thread(target=lambda: asyncio.run(finisher.run()))]
            for thread in threads:
                thread.start()
            time.sleep(3.0)
            ledger.kill()  # kill -9
            killed_at = time.monotonic() - origin
            time.sleep(2.0)
            with start_ledger(store=store, key=KEY, port=ledger.port) as again:
                restarted_at = time.monotonic() - origin
                time.sleep(6.0)
                stop.set()
                finisher.stop.set()
                for thread in threads:
                    thread.join(timeout=60)
                recorded = asyncio.run(_ok_events(again.address, rollouts))

    statuses = Counter(answer.status for answer in result)
    assert set(statuses) <= {200, 503}, statuses
    lost = 0
    for rollout_id in rollouts:
        answered_ok = sum(1 for a in result if a.rollout_id == rollout_id and a.status == 200)
        lost += max(answered_ok - recorded[rollout_id], 0)
    assert lost == 0
    duplicates = len(finisher.delivered) - len(set(finisher.delivered))
    missing = set(finisher.acknowledged) - set(finisher.delivered)
    assert duplicates == 0 and not missing, (duplicates, sorted(missing))
    after = [a for t, a in timeline if t > restarted_at + 4.0]
    assert after and all(a.status == 200 for a in after), Counter(a.status for a in after)  # the proxy reconnected
    first_ok = min((t for t, a in timeline if t > restarted_at and a.status == 200), default=float("nan"))
    report(
        "ledger kill -9 (SQLite) and restart (4 agents + a rollout finisher + a terminal watch)",
        f"{statuses[200]} calls acknowledged, 0 lost; {statuses[503]} x 503 during the {restarted_at - killed_at:.1f}s "
        f"outage; terminal watch: {len(finisher.acknowledged)} finished rollouts delivered, 0 lost, 0 duplicates; "
        f"first 200 {first_ok - restarted_at:.1f}s after the restart",
    )
