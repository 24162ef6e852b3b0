"""The whole stack for the end-to-end tests: the compose services as local processes (services/stack/local_stack.py),
started once for the tests of this package, with the compose commands and environment, auth on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services._gen.agl.v1 import ledger_service_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient
from services.stack import local_stack

KEY = "e2e-master-key"
MODEL = "agl-policy"
MATH_AGENT = "examples.math_agent.agent:MathAgent"
CALC_AGENT = "examples.calc_agent.agent:CalcAgent"
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}


@dataclass
class Stack:
    ledger: str
    proxy_url: str
    engine_url: str
    data_dir: Path
    running: Mapping[str, local_stack.RunningService]

    def client(self) -> LedgerClient:
        return LedgerClient(self.ledger, key=KEY)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{svc.log_tail(3000)}" for name, svc in self.running.items())


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("e2e-stack")
    specs = local_stack.load_compose({"AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL}, profiles=["standin"])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller", "standin")}
    overrides = {"controller": {"AGL_CONTROLLER_LOG_DIR": str(data_dir / "agent-logs")}}
    plans = local_stack.localize(specs, data_dir, overrides)
    with local_stack.run_stack(plans, local_stack.start_order(specs), data_dir / "logs") as running:
        engine_url = f"http://{running['standin'].address(8000)}/v1"
        ledger = running["ledger"].address(50051)

        async def register() -> None:
            async with LedgerClient(ledger, key=KEY) as client:
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=engine_url)])

        asyncio.run(register())
        yield Stack(ledger, f"http://{running['proxy'].address(8080)}", engine_url, data_dir, running)


def spec(
    run: str,
    name: str,
    task: Mapping[str, Any],
    *,
    agent_class: str,
    env_map: Mapping[str, str] = TASK_ENV,
    group: str = "",
    timeout_s: float = 60.0,
    is_train: bool = True,
) -> rollout_pb2.RolloutSpec:
    labels = {"run": run, "group": group or name}
    return rollout_pb2.RolloutSpec(
        rollout_id=f"{run}-{name}",
        input_json=json.dumps(dict(task)),
        is_train=is_train,
        config=rollout_pb2.RolloutConfig(
            timeout_seconds=timeout_s,
            local=rollout_pb2.LocalLaunchConfig(agent_class=agent_class, env_map=dict(env_map)),
        ),
        metadata=rollout_pb2.RolloutMetadata(labels=labels),
    )


async def run_to_end(
    stack: Stack, client: LedgerClient, run: str, specs: Sequence[rollout_pb2.RolloutSpec], timeout_s: float = 90.0
) -> dict[str, ledger_service_pb2.TerminalRollout]:
    """Creates the rollouts and reads the terminal stream until every one of them ended."""
    await client.create_rollouts(specs)
    wanted = {s.rollout_id for s in specs}
    entries: dict[str, ledger_service_pb2.TerminalRollout] = {}

    async def consume() -> None:
        async for entry in client.watch_terminal(labels={"run": run}, include_events=True):
            entries[entry.rollout.rollout_id] = entry
            if wanted <= entries.keys():
                return

    try:
        await asyncio.wait_for(consume(), timeout_s)
    except asyncio.TimeoutError:
        pytest.fail(f"only {sorted(entries)} of {sorted(wanted)} ended within {timeout_s}s\n{stack.logs()}")
    return entries
