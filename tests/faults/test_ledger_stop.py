"""The ledger stopped (SIGSTOP) for 10 s while agents call: each agent gets an answer within the proxy's ledger
deadline (503 while the ledger is away), no call is answered 200 without its record, and calls succeed again after
SIGCONT."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from tests.proxy.conftest import KEY, model_endpoints, new_rollout, run_proxy, run_standin
from tests.support.procs import start_ledger

from .calls import Answer, call_loop
from .figures import report

LEDGER_TIMEOUT_S, STOPPED_S = 3.0, 10.0


async def _setup(address: str, engine) -> list[str]:
    async with LedgerClient(address, KEY) as client:
        await client.register_models(model_endpoints(engine))
        return [await new_rollout(client) for _ in range(6)]


async def _ok_events(address: str, rollout_ids: list[str]) -> dict[str, int]:
    async with LedgerClient(address, KEY) as client:
        counts = {}
        for rollout_id in rollout_ids:
            events = await client.list_events(rollout_id, event_type="model_request")
            counts[rollout_id] = sum(1 for e in events if e.model_request.status == event_pb2.MODEL_REQUEST_STATUS_OK)
        return counts


def test_ledger_sigstop_under_load(tmp_path: Path) -> None:
    timeline: list[tuple[float, Answer]] = []
    with start_ledger(store=f"sqlite:{tmp_path / 'ledger.db'}", key=KEY) as ledger, run_standin() as engine:
        rollouts = asyncio.run(_setup(ledger.address, engine))
        args = ["--ledger-timeout", str(LEDGER_TIMEOUT_S), "--rollout-cache-ttl", "600"]
        with run_proxy(ledger.address, args=args) as proxy:
            stop = threading.Event()
            result: list[Answer] = []

            def loop() -> None:
                result.extend(call_loop(proxy.url, rollouts, stop, on_answer=lambda a: timeline.append((now(), a))))

            origin = time.monotonic()

            def now() -> float:
                return time.monotonic() - origin

            runner = threading.Thread(target=loop)
            runner.start()
            stopped_at = resumed_at = 0.0
            try:
                time.sleep(2.0)
                os.kill(ledger.proc.pid, signal.SIGSTOP)
                stopped_at = now()
                time.sleep(STOPPED_S)
                os.kill(ledger.proc.pid, signal.SIGCONT)
                resumed_at = now()
                time.sleep(6.0)
            finally:
                stop.set()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(ledger.proc.pid, signal.SIGCONT)
                runner.join(timeout=60)
            recorded = asyncio.run(_ok_events(ledger.address, rollouts))

    statuses = Counter(answer.status for answer in result)
    assert set(statuses) <= {200, 503}, statuses
    slowest = max(answer.seconds for answer in result)
    bound = 2 * LEDGER_TIMEOUT_S + 2.0
    assert slowest < bound, (slowest, bound)
    assert statuses[503] > 0  # the stop was felt
    for rollout_id in rollouts:
        answered_ok = sum(1 for a in result if a.rollout_id == rollout_id and a.status == 200)
        # Every 200 has its record; a 503 may still have been recorded once the ledger woke up (never the reverse).
        assert (
            answered_ok
            <= recorded[rollout_id]
            <= answered_ok + sum(1 for a in result if a.rollout_id == rollout_id and a.status == 503)
        ), (rollout_id, answered_ok, recorded[rollout_id])
    after = [a for t, a in timeline if t > resumed_at + LEDGER_TIMEOUT_S + 1.0]
    assert after and all(a.status == 200 for a in after), Counter(a.status for a in after)
    first_ok = min((t for t, a in timeline if t > resumed_at and a.status == 200), default=float("nan"))
    report(
        f"ledger SIGSTOP {STOPPED_S:.0f}s (6 agents, ledger deadline {LEDGER_TIMEOUT_S:.0f}s)",
        f"{len(result)} calls: {statuses[200]} ok, {statuses[503]} x 503, slowest answer {slowest:.1f}s "
        f"(bound {bound:.0f}s), 0 answered 200 unrecorded, first 200 {first_ok - resumed_at:.1f}s after SIGCONT "
        f"(stopped at {stopped_at:.1f}s)",
    )
