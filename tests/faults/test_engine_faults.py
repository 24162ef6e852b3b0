"""An engine killed (kill -9), then another hung (SIGSTOP), while agents call: the proxy retries on the next engine,
every answered call is recorded (ok or error) and every agent gets its answer within the configured timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from tests.proxy.conftest import KEY, model_endpoints, new_rollout, run_proxy, run_standin
from tests.support.procs import start_ledger

from .calls import call_loop
from .figures import report

READ_TIMEOUT_S, ATTEMPTS = 2.0, 3


async def _setup(address: str, engines) -> list[str]:
    async with LedgerClient(address, KEY) as client:
        await client.register_models(model_endpoints(*engines))
        return [await new_rollout(client) for _ in range(6)]


async def _events(address: str, rollout_ids: list[str]) -> dict[str, list[event_pb2.Event]]:
    async with LedgerClient(address, KEY) as client:
        return {r: await client.list_events(r) for r in rollout_ids}


def test_engine_killed_then_hung_fails_over_and_records_every_call() -> None:
    with (
        start_ledger(key=KEY) as ledger,
        run_standin() as a,
        run_standin() as b,
        run_standin() as c,
    ):
        rollouts = asyncio.run(_setup(ledger.address, [a, b, c]))
        args = ["--retry-attempts", str(ATTEMPTS), "--read-timeout", str(READ_TIMEOUT_S), "--connect-timeout", "1"]
        with run_proxy(ledger.address, args=args) as proxy:
            stop = threading.Event()
            result: list = []
            runner = threading.Thread(target=lambda: result.extend(call_loop(proxy.url, rollouts, stop)))
            runner.start()
            try:
                time.sleep(2.0)
                a.process.kill()  # kill -9: connections refused from now on
                time.sleep(3.0)
                os.kill(b.process.proc.pid, signal.SIGSTOP)  # hung: connections accepted, nothing answered
                time.sleep(6.0)
            finally:
                stop.set()
                runner.join(timeout=60)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.process.proc.pid, signal.SIGCONT)
            events = asyncio.run(_events(ledger.address, rollouts))

    answers = result
    statuses = Counter(answer.status for answer in answers)
    assert answers and not runner.is_alive()
    assert set(statuses) <= {200, 502, 503, 504}, statuses  # every agent got an HTTP answer, none a hang or a reset
    bound = ATTEMPTS * READ_TIMEOUT_S + 3.0
    slowest = max(answer.seconds for answer in answers)
    assert slowest < bound, (slowest, bound)
    for rollout_id in rollouts:
        mine = [answer for answer in answers if answer.rollout_id == rollout_id]
        calls = [e.model_request for e in events[rollout_id] if e.event_type == "model_request"]
        ok = sum(1 for call in calls if call.status == event_pb2.MODEL_REQUEST_STATUS_OK)
        assert ok == sum(1 for answer in mine if answer.status == 200), rollout_id
        answered_by_engines = sum(1 for answer in mine if answer.status in (200, 502, 504))
        assert len(calls) == answered_by_engines, (rollout_id, len(calls), Counter(a.status for a in mine))
    ok_share = statuses[200] / len(answers)
    assert ok_share > 0.8, statuses  # the third engine carried the load
    retried = sum(
        1 for r in events.values() for e in r if e.event_type == "model_request" and e.model_request.retry_count
    )
    report(
        "engine kill -9 then SIGSTOP (3 engines, 6 agents)",
        f"{len(answers)} calls, {statuses[200]} ok, {len(answers) - statuses[200]} errors ({dict(statuses)}), "
        f"{retried} recorded with retries, slowest answer {slowest:.1f}s (bound {bound:.0f}s), "
        f"recorded {sum(len(r) for r in events.values())}/{sum(statuses[s] for s in (200, 502, 504))}",
    )
