"""Endpoint registration against the real ledger: a new launch's engines replace an earlier launch's."""

from __future__ import annotations

from pathlib import Path

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager
from tests.support.procs import ServiceProcess


async def test_replace_endpoints_removes_an_earlier_launchs_engines(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    model, other = f"{run_id}-model", f"{run_id}-other"
    manager = RolloutManager(client, ManagerSettings(run_id=run_id, state_path=tmp_path / "s.json", progress=False))
    try:
        # The earlier launch (verl picked other ports) and an unrelated model sharing the ledger.
        await manager.register_endpoints(model, ["http://10.0.0.1:40001/v1", "http://10.0.0.2:40002/v1"], 12)
        await client.register_models([model_pb2.ModelEndpoint(model_name=other, endpoint="http://10.0.0.9:8000/v1")])

        new = ["http://10.0.0.1:41001/v1", "http://10.0.0.2:40002/v1"]
        assert await manager.replace_endpoints(model, new, 0) == 1
        listed = sorted((m.endpoint, m.version) for m in await client.list_models(model))
        assert listed == [("http://10.0.0.1:41001/v1", 0), ("http://10.0.0.2:40002/v1", 0)]
        assert [m.endpoint for m in await client.list_models(other)] == ["http://10.0.0.9:8000/v1"]

        # Same set again (every later step): nothing to delete, the version moves on.
        assert await manager.replace_endpoints(model, new, 1) == 0
        assert {m.version for m in await client.list_models(model)} == {1}
    finally:
        await client.close()
