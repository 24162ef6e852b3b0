"""kill -9 of a controller mid-run, then a second controller with the same controller id (what a restarted pod or
service unit is), or with another id (a second replica, which takes over once the dead one's lease expires): no
rollout attempt is launched twice, and none is left stranded in running."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from tests.proxy.conftest import KEY, run_proxy
from tests.support.procs import ServiceProcess, free_port, start_ledger, start_service, wait_http_ready

from .figures import report

TERMINAL = (rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED)
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
ROLLOUTS = 12
# The agent notes its launch (rollout and attempt, from its event URL), works for a while, then posts its reward.
AGENT = """
import os, sys, time, httpx
url = os.environ["AGL_EVENT_URL"]
with open(sys.argv[1], "a") as notes:
    notes.write(url.split("/api/rollouts/")[1].rsplit("/events", 1)[0] + "\\n")
time.sleep(3.0)
headers = {"Authorization": "Bearer " + os.environ["AGL_KEY"]}
httpx.post(url, json={"event_type": "reward", "data": {"value": 1.0}}, headers=headers, timeout=30).raise_for_status()
"""


@contextlib.contextmanager
def controller(
    ledger: str, proxy_url: str, log_dir: Path, name: str, controller_id: str = "ctl-fault", lease_ttl: float = 30.0
) -> Iterator[ServiceProcess]:
    port = free_port()
    argv = [sys.executable, "-m", "services.controller", "--ledger", ledger, "--proxy-url", proxy_url]
    argv += ["--controller-id", controller_id, "--log-dir", str(log_dir), "--max-concurrency", "6"]
    argv += ["--lease-ttl", str(lease_ttl)]
    argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--kill-grace", "0.5"]
    url = f"http://127.0.0.1:{port}/metrics"
    with start_service(
        argv, name=name, port=port, env={"AGL_KEY": KEY}, ready=lambda _: wait_http_ready(url)
    ) as process:
        yield process


async def _create(address: str, agent: Path, notes: Path, retry_every: int = 0) -> list[str]:
    """ROLLOUTS rollouts; every `retry_every`-th one (0: none) may retry a lost attempt once."""
    async with LedgerClient(address, KEY) as client:
        specs = []
        for index in range(ROLLOUTS):
            config = rollout_pb2.RolloutConfig(timeout_seconds=60)
            config.local.command.extend([sys.executable, str(agent), str(notes)])
            if retry_every and index % retry_every == 0:
                config.retry.CopyFrom(
                    rollout_pb2.RetryPolicy(max_attempts=2, retry_on=[rollout_pb2.FAILURE_REASON_LOST])
                )
            specs.append(rollout_pb2.RolloutSpec(rollout_id=f"ro-ctl-{index:02d}", input_json="{}", config=config))
        return [r.rollout_id for r in await client.create_rollouts(specs)]


async def _states(address: str, ids: list[str]) -> dict[str, rollout_pb2.Rollout]:
    async with LedgerClient(address, KEY) as client:
        return {rollout_id: await client.get_rollout(rollout_id) for rollout_id in ids}


def test_controller_kill_9_and_a_second_controller(tmp_path: Path) -> None:
    agent, notes, logs = tmp_path / "agent.py", tmp_path / "launches.txt", tmp_path / "agent-logs"
    agent.write_text(AGENT)
    with (
        start_ledger(store=f"sqlite:{tmp_path / 'ledger.db'}", key=KEY) as ledger,
        run_proxy(ledger.address) as proxy,
        controller(ledger.address, proxy.url, logs, "controller-1") as first,
    ):
        ids = asyncio.run(_create(ledger.address, agent, notes))
        deadline = time.monotonic() + 30
        while sum(1 for r in asyncio.run(_states(ledger.address, ids)).values() if r.status.state == RUNNING) < 4:
            assert time.monotonic() < deadline, "agents did not start"
            time.sleep(0.2)
        first.kill()  # kill -9, agents mid-run
        running_at_kill = sum(
            1 for r in asyncio.run(_states(ledger.address, ids)).values() if r.status.state == RUNNING
        )
        with controller(ledger.address, proxy.url, logs, "controller-2"):
            started = time.monotonic()
            deadline = started + 90
            while True:
                states = asyncio.run(_states(ledger.address, ids))
                if all(r.status.state in TERMINAL for r in states.values()):
                    break
                assert time.monotonic() < deadline, Counter(r.status.state for r in states.values())
                time.sleep(0.2)
            settled_s = time.monotonic() - started

    launches = Counter(notes.read_text().split())
    twice = {pair: count for pair, count in launches.items() if count > 1}
    assert not twice, twice
    outcome = Counter(rollout_pb2.RolloutState.Name(r.status.state) for r in states.values())
    failed = {r.rollout_id: r.status.error_message for r in states.values() if r.status.state != TERMINAL[0]}
    report(
        f"controller kill -9 with {running_at_kill} agents running, a second controller (same id) started",
        f"{ROLLOUTS} rollouts: {dict(outcome)}; 0 attempts launched twice ({len(launches)} launches); none left "
        f"running: all terminal {settled_s:.1f}s after the second controller started"
        + (f"; failed: {sorted(set(failed.values()))[:2]}" if failed else ""),
    )


async def _terminal_entries(address: str) -> Counter[str]:
    async with LedgerClient(address, KEY) as client:
        page = await client.list_terminal(page_size=1000)
    return Counter(entry.rollout.rollout_id for entry in page.entries)


def test_a_controller_with_another_id_takes_over_a_dead_ones_rollouts(tmp_path: Path) -> None:
    """Controller A (lease TTL 2 s) is killed with agents running; controller B, another id on "another host" (its
    own log directory, so A's agents are not visible to it), takes over A's running rollouts once A's lease
    expires: those without a retry policy fail with the reason, those with one run again as attempt 2."""
    ttl = 2.0
    agent, notes = tmp_path / "agent.py", tmp_path / "launches.txt"
    agent.write_text(AGENT)
    with (
        start_ledger(store=f"sqlite:{tmp_path / 'ledger.db'}", key=KEY) as ledger,
        run_proxy(ledger.address) as proxy,
        controller(ledger.address, proxy.url, tmp_path / "logs-a", "controller-a", "ctl-a", ttl) as first,
    ):
        ids = asyncio.run(_create(ledger.address, agent, notes, retry_every=2))
        deadline = time.monotonic() + 30
        while sum(1 for r in asyncio.run(_states(ledger.address, ids)).values() if r.status.state == RUNNING) < 4:
            assert time.monotonic() < deadline, "agents did not start"
            time.sleep(0.2)
        first.kill()  # kill -9, agents mid-run
        killed = time.monotonic()
        at_kill = {
            rid: r.status.attempt_id
            for rid, r in asyncio.run(_states(ledger.address, ids)).items()
            if r.status.state == RUNNING
        }
        with controller(ledger.address, proxy.url, tmp_path / "logs-b", "controller-b", "ctl-b", ttl):
            started = time.monotonic()
            taken_s = None
            deadline = started + 90
            while True:
                states = asyncio.run(_states(ledger.address, ids))
                moved = [rid for rid, attempt in at_kill.items() if states[rid].status.attempt_id != attempt
                         or states[rid].status.state in TERMINAL]  # fmt: skip
                if taken_s is None and len(moved) == len(at_kill):
                    taken_s = time.monotonic() - killed
                if taken_s is not None and all(r.status.state in TERMINAL for r in states.values()):
                    break
                assert time.monotonic() < deadline, Counter(r.status.state for r in states.values())
                time.sleep(0.1)
            settled_s = time.monotonic() - started
        terminal = asyncio.run(_terminal_entries(ledger.address))

    launches = Counter(notes.read_text().split())
    twice = {pair: count for pair, count in launches.items() if count > 1}
    assert not twice, twice
    assert {rid: terminal[rid] for rid in ids} == dict.fromkeys(ids, 1)  # each rollout ended exactly once
    bound = ttl + ttl / 3 + 10.0  # the lease, B's next heartbeat, and B's start-up on a loaded 2-core machine
    assert taken_s is not None and taken_s <= bound, (taken_s, bound)
    retried = [rid for rid in at_kill if ids.index(rid) % 2 == 0]
    plain = [rid for rid in at_kill if ids.index(rid) % 2 == 1]
    assert retried and plain, at_kill
    for rid in plain:
        status = states[rid].status
        assert status.state == rollout_pb2.ROLLOUT_STATE_FAILED, status
        assert status.failure_reason == rollout_pb2.FAILURE_REASON_LOST and status.controller_id == "ctl-b"
        assert "controller ctl-a stopped heartbeating at" in status.error_message, status.error_message
        assert "its agent process was not observed" in status.error_message, status.error_message
        assert [a.attempt_id for a in status.attempts] == [at_kill[rid]]  # failed, not launched again
    for rid in retried:
        status = states[rid].status
        assert status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, status
        assert [a.number for a in status.attempts] == [1, 2] and status.attempts[0].attempt_id == at_kill[rid]
        assert "ctl-a stopped heartbeating" in status.attempts[0].error_message
    rest = [rid for rid in ids if rid not in at_kill]
    assert all(states[rid].status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED for rid in rest)
    assert all(len(states[rid].status.attempts) == 1 for rid in rest)
    report(
        f"controller kill -9 with {len(at_kill)} agents running, a second controller (another id) started, lease TTL "
        f"{ttl:g} s",
        f"{ROLLOUTS} rollouts, 0 attempts launched twice ({len(launches)} launches), each in the terminal log once; "
        f"the dead one's {len(at_kill)} running rollouts taken over {taken_s:.1f}s after the kill (bound "
        f"{bound:.1f}s): {len(plain)} failed as lost ('controller ctl-a stopped heartbeating at ...'), {len(retried)} "
        f"succeeded as attempt 2; all terminal {settled_s:.1f}s after the second controller started",
    )
