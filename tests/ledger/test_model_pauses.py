"""A pause that names one model (issue 32 item 3): it sits beside the proxy-wide pause without touching it, has its
own owner and lease (renewed without a new generation, lifted when its owner stops), is stored, and a drain of that
model waits only for the calls routed to it. Real ledger processes on loopback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from services.client import LedgerClient
from services.trainer.run.drain import ProxyDrainer, is_drained
from tests.support.procs import start_ledger

KEY = "model-pause-key"


def paused_models(control) -> dict[str, str]:
    return {p.model_name: p.owner for p in control.model_pauses}


async def test_model_pauses_sit_beside_the_proxy_pause_each_with_its_own_owner_and_lease(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=spec, key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            a = await client.set_proxy_pause(True, 3, "update a", owner="trainer:a", lease_seconds=1.0, model_name="a")
            assert not a.paused and paused_models(a) == {"a": "trainer:a"}
            b = await client.set_proxy_pause(True, 4, "update b", owner="trainer:b", model_name="b")
            assert paused_models(b) == {"a": "trainer:a", "b": "trainer:b"} and b.generation == a.generation + 1
            # The owner renews its model's pause: same generation.
            renewed = await client.set_proxy_pause(True, 3, "update a", owner="trainer:a", lease_seconds=1.0,
                                                   model_name="a")  # fmt: skip
            assert renewed.generation == b.generation
            # The proxy-wide pause and its resume leave the model pauses as they are.
            everything = await client.set_proxy_pause(True, 5, "operator")
            assert everything.paused and paused_models(everything) == {"a": "trainer:a", "b": "trainer:b"}
            resumed = await client.set_proxy_pause(False)
            assert not resumed.paused and set(paused_models(resumed)) == {"a", "b"}
            # a stops renewing: its lease runs out and only its pause is lifted.
            started = time.monotonic()
            while "a" in paused_models(control := await client.get_proxy_control()):
                assert time.monotonic() - started < 5, control
                await asyncio.sleep(0.05)
            assert paused_models(control) == {"b": "trainer:b"} and not control.paused
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.set_proxy_pause(True, 3, "x", lease_seconds=1.0, model_name="a")
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "pause of model a lifted by the ledger: trainer:a did not renew it" in ledger.log_text()
    with start_ledger(store=spec, key=KEY) as ledger:  # stored
        async with LedgerClient(ledger.address, KEY) as client:
            control = await client.get_proxy_control()
            assert paused_models(control) == {"b": "trainer:b"}
            assert control.model_pauses[0].reason == "update b" and control.model_pauses[0].retry_after_seconds == 4
            assert not paused_models(await client.set_proxy_pause(False, model_name="b"))


async def test_a_drain_of_one_model_waits_only_for_the_calls_routed_to_it() -> None:
    with start_ledger(key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            drainer = ProxyDrainer(client, timeout_s=5.0, owner="trainer:a", lease_s=30.0, model_name="a")
            control = await client.get_proxy_control()
            # One replica with a call of b in flight and one of a; it applies the pause a moment later.
            await client.report_proxy_replica("r1", 2, control.generation, model_in_flight={"a": 1, "b": 1})

            async def replica() -> None:
                await asyncio.sleep(0.3)
                now = await client.get_proxy_control()
                await client.report_proxy_replica("r1", 1, now.generation, model_in_flight={"b": 1})

            reporting = asyncio.create_task(replica())
            result = await drainer.pause_and_drain("step 1")
            await reporting
            assert result.drained and 0.25 < result.seconds < 3, result
            control = await client.get_proxy_control()
            assert control.replicas[0].in_flight == 1 and dict(control.replicas[0].model_in_flight) == {"b": 1}
            assert is_drained(control, control.generation, "a") and not is_drained(control, control.generation)
            assert paused_models(control) == {"a": "trainer:a"} and not control.paused
            await drainer.resume()
            assert not (await client.get_proxy_control()).model_pauses
