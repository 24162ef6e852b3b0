"""The proxy's append stream against the real ledger: concurrent appends are grouped, each caller still gets
its own sequences, and a refused batch is split so that only the offending append fails."""

from __future__ import annotations

import asyncio
import json

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from services.proxy.append_stream import AppendStream
from services.proxy.errors import ProxyError

from .conftest import new_rollout


def note(rollout_id: str, n: int) -> event_pb2.Event:
    return event_pb2.Event(rollout_id=rollout_id, attempt_id="at-1", event_type="note", data_json=json.dumps({"n": n}))


async def test_concurrent_appends_are_grouped_and_refusals_stay_with_their_caller(client: LedgerClient) -> None:
    live, finished = await new_rollout(client), await new_rollout(client)
    await client.update_status(finished, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
    stream = AppendStream(client)
    try:
        grouped = await asyncio.gather(*(stream.append([note(live, -1 - n)]) for n in range(20)))
        assert stream.batches < 20  # grouped: fewer stream requests than appends
        assert len({s for r in grouped for s in r.sequences}) == 20
        targets = [finished if n % 7 == 3 else live for n in range(40)]
        results = await asyncio.gather(
            *(stream.append([note(r, n)], reject_terminal=True) for n, r in enumerate(targets)),
            return_exceptions=True,
        )
    finally:
        await stream.close()
    stored = {json.loads(e.data_json)["n"]: e.sequence for e in await client.list_events(live)}
    stored = {n: sequence for n, sequence in stored.items() if n >= 0}
    for n, (target, result) in enumerate(zip(targets, results, strict=True)):
        if target == finished:
            assert isinstance(result, ProxyError) and result.kind == "rollout_terminal"
        else:
            assert not isinstance(result, BaseException) and list(result.sequences) == [stored[n]]
    assert sorted(stored) == [n for n, r in enumerate(targets) if r == live]
    assert await client.list_events(finished) == []
