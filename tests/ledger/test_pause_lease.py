"""A proxy pause that names its owner and holds a lease (issue 29 item 3): renewed by its owner without a new
generation, lifted by the ledger when the owner stops renewing it (watchers told, the lift stored), even across a
restart; bad leases are INVALID_ARGUMENT. Real ledger processes on loopback, both stores."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest

from services.client import LedgerClient
from services.trainer.run.drain import ProxyDrainer
from tests.support.procs import start_ledger

KEY = "pause-lease-key"


async def wait_resumed(client: LedgerClient, timeout_s: float = 10.0) -> float:
    started = time.monotonic()
    while (control := await client.get_proxy_control()).paused:
        assert time.monotonic() - started < timeout_s, control
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_leased_pause_is_renewed_by_its_owner_and_lifted_once_it_stops(tmp_path: Path, store: str) -> None:
    spec = "memory" if store == "memory" else f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=spec, key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client, LedgerClient(ledger.address, KEY) as watcher:
            paused = await client.set_proxy_pause(True, 7, "update", owner="trainer:r1", lease_seconds=1.0)
            assert paused.paused and paused.owner == "trainer:r1" and paused.HasField("lease_expire_time")
            seen: list = []

            async def watch() -> None:
                async for control in watcher.watch_proxy_control():
                    seen.append(control)

            watching = asyncio.create_task(watch())
            for _ in range(4):  # 2 s of renewals, twice the lease: still the same pause
                await asyncio.sleep(0.5)
                renewed = await client.set_proxy_pause(True, 7, "update", owner="trainer:r1", lease_seconds=1.0)
                assert renewed.paused and renewed.generation == paused.generation
            # The owner stops (killed): the ledger lifts the pause once the lease runs out.
            lifted_s = await wait_resumed(client, timeout_s=5)
            control = await client.get_proxy_control()
            assert control.generation == paused.generation + 1 and control.owner == ""
            assert "lifted by the ledger: trainer:r1 did not renew its pause" in control.reason, control.reason
            assert "update" in control.reason
            await asyncio.sleep(0.3)
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        assert any(c.paused for c in seen) and not seen[-1].paused and "lifted" in seen[-1].reason
        log = ledger.log_text()
    assert "proxies resumed" in log and "did not renew its pause" in log, log
    assert lifted_s < 2.5, lifted_s
    if store == "sqlite":  # the lift was stored
        with start_ledger(store=spec, key=KEY) as ledger:
            async with LedgerClient(ledger.address, KEY) as client:
                assert not (await client.get_proxy_control()).paused


async def test_a_leased_pause_that_ran_out_while_the_ledger_was_down_is_lifted_at_restart(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=spec, key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            await client.set_proxy_pause(True, 5, "update", owner="trainer:r2", lease_seconds=1.0)
    time.sleep(1.2)
    with start_ledger(store=spec, key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            control = await client.get_proxy_control()
    assert not control.paused and "trainer:r2 did not renew" in control.reason, control


async def test_another_owner_or_no_lease_is_a_new_pause_that_holds() -> None:
    with start_ledger(key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            first = await client.set_proxy_pause(True, 5, "a", owner="trainer:a", lease_seconds=30)
            second = await client.set_proxy_pause(True, 5, "b", owner="trainer:b", lease_seconds=30)
            assert second.generation == first.generation + 1 and second.owner == "trainer:b"
            manual = await client.set_proxy_pause(True, 5, "operator")  # no owner, no lease: holds until resumed
            assert manual.generation == second.generation + 1 and not manual.HasField("lease_expire_time")
            await asyncio.sleep(0.3)
            assert (await client.get_proxy_control()).paused
            await client.set_proxy_pause(False)


@pytest.mark.parametrize(
    "owner, lease, paused, says",
    [
        ("", 5.0, True, "needs an owner"),
        ("t", -1.0, True, "lease_seconds must be between"),
        ("t", float("nan"), True, "lease_seconds must be between"),
        ("t", 1e9, True, "lease_seconds must be between"),
        ("t", 0.0, False, "go with a pause, not a resume"),
    ],
)
async def test_bad_leases_are_invalid_argument_and_change_nothing(owner, lease, paused, says) -> None:
    with start_ledger(key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            before = await client.get_proxy_control()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.set_proxy_pause(paused, 5, "x", owner=owner, lease_seconds=lease)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert says in (refused.value.details() or ""), refused.value.details()
            assert await client.get_proxy_control() == before


async def test_the_trainers_drainer_renews_its_pause_until_it_resumes_and_a_dead_one_is_lifted() -> None:
    with start_ledger(key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            drainer = ProxyDrainer(client, retry_after_seconds=3, timeout_s=10, owner="trainer:run-7", lease_s=0.9)
            assert (await drainer.pause_and_drain("step 3 weight update")).drained
            generation = (await client.get_proxy_control()).generation
            await asyncio.sleep(2.0)  # over twice the lease: the drainer renewed it
            control = await client.get_proxy_control()
            assert control.paused and control.owner == "trainer:run-7" and control.generation == generation
            await drainer.resume()
            assert not (await client.get_proxy_control()).paused

            # A trainer that dies mid-update stops renewing: its lease task gone, no resume.
            assert (await drainer.pause_and_drain("step 4 weight update")).drained
            drainer._lease.stop()  # what a kill -9 does to it
            lifted_s = await wait_resumed(client, timeout_s=5)
    assert lifted_s < 2.0, lifted_s
