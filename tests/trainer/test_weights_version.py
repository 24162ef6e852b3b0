"""Captured calls carry the same model_version in both placements: the version of the weights the engines serve.

External engines are registered by push_weights at the step whose update they loaded. verl's own replicas
(colocated) are registered by the trainer; before, at the step being collected (one more). The trainer's
registration and sync run here against the real ledger; verl's vLLM replicas and checkpoint engine, which need a
GPU, are stand-ins that record what the trainer asked of them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.client import LedgerClient
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager
from services.trainer.verl.loop_thread import LoopThread
from tests.support.procs import ServiceProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's and Ray's import-time deprecation warnings
    from services.trainer.verl.ppo_trainer import AglPPOTrainer

pytestmark = pytest.mark.trainer

REPLICAS = ["10.0.0.1:41001", "10.0.0.2:41002"]


@dataclass
class Replicas:
    """verl's LLM server manager and checkpoint manager, as far as the trainer uses them."""

    synced: list[int] = field(default_factory=list)

    def get_addresses(self) -> list[str]:
        return REPLICAS

    def update_weights(self, version: int) -> None:
        self.synced.append(version)


def test_colocated_replicas_are_registered_at_the_version_they_serve(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    model = f"{run_id}-model"
    loop = LoopThread()
    client = LedgerClient(ledger.address)
    replicas = Replicas()
    trainer = object.__new__(AglPPOTrainer)
    trainer.agl = SimpleNamespace(external_engines=False, model_name=model)
    trainer.loop, trainer.ledger = loop, client
    trainer.manager = RolloutManager(client, ManagerSettings(run_id=run_id, state_path=tmp_path / "s.json"))
    trainer.llm_server_manager = trainer.checkpoint_manager = replicas

    async def versions() -> set[int]:
        return {m.version for m in await client.list_models(model)}

    try:
        # fit: the engines get the start weights (step 0), then each step registers, collects, updates, syncs.
        trainer.global_steps = 0
        trainer._sync_weights({})
        assert loop.run(versions()) == {0}
        for step in (1, 2):
            trainer.global_steps = step
            trainer._register()  # the step's start: its calls are sampled with the last sync's weights
            assert loop.run(versions()) == {step - 1}, f"step {step} collects from the weights of step {step - 1}"
            trainer._sync_weights({})
            assert loop.run(versions()) == {step}
        assert replicas.synced == [0, 1, 2]
    finally:
        loop.run(client.close())
        loop.close()
