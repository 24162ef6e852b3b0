"""What the CPU training tests share: the real stack around the session's CPU engine, the trainer's overrides for
a small run, and reading what a run left (metrics, weights). Used by the installed command's tests
(test_cpu_training.py) and by the trainer image's (tests/deploy/test_trainer_image.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.stack import local_stack
from tests.support.engine import Engine

KEY = "cpu-training-key"
MODEL = "agl-policy"
AGENT = "tests.trainer.agents:ParityAgent"
TRAINER = Path(sys.executable).with_name("agl-trainer")


@dataclass
class Stack:
    ledger: str
    root: Path
    proxy_url: str = ""
    # The running ledger, proxy and controller (local_stack.kill_and_restart takes them down and up again).
    services: dict[str, local_stack.RunningService] = field(default_factory=dict)

    def client(self) -> LedgerClient:
        return LedgerClient(self.ledger, key=KEY)


@contextlib.contextmanager
def start(root: Path, engine: Engine) -> Iterator[Stack]:
    """Ledger, proxy and controller as the compose file runs them (local processes, auth on), the engine
    registered as the model's endpoint; the engine gets its starting weights back at the end."""
    specs = local_stack.load_compose({"AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL}, profiles=[])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller")}
    overrides = {"controller": {"AGL_CONTROLLER_LOG_DIR": str(root / "agent-logs")}}
    if engine.api_key:  # a keyed engine: the proxies send its key
        overrides["proxy"] = {"AGL_ENGINE_API_KEY": engine.api_key}
    plans = local_stack.localize(specs, root, overrides)
    with local_stack.run_stack(plans, local_stack.start_order(specs), root / "logs") as running:
        ledger = running["ledger"].address(50051)

        async def register() -> None:
            async with LedgerClient(ledger, key=KEY) as client:
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=engine.openai_url)])

        asyncio.run(register())
        try:
            yield Stack(ledger, root, proxy_url="http://" + running["proxy"].address(8080), services=running)
        finally:
            # Other tests share the session's engine: give it back its starting weights.
            engine.restore_base_weights()


def write_tasks(path: Path, modes: Sequence[str]) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"t{i}", "q": f"task {i}", "mode": m}) + "\n" for i, m in enumerate(modes))
    )
    return path


def trainer_overrides(
    engine: Engine,
    run_id: str,
    tasks: Path | str,
    out: Path,
    *,
    steps: int,
    lr: float,
    model: str = MODEL,
    agent: str = AGENT,
    env_map: Mapping[str, str] | None = None,
    tasks_per_step: int = 2,
    prompt_length: int = 32,
    response_length: int = 8,
    timeout_s: int = 60,
) -> list[str]:
    """`agl-trainer` overrides of a small CPU run writing under `out` (the ledger's address and key not included):
    by default the ParityAgent's, 2 tasks x 4 rollouts a step."""
    env_map = {"AGL_TASK": "input"} if env_map is None else env_map
    return [
        "placement=cpu",
        f"agl.run_id={run_id}",
        f"agl.model_name={model}",
        f"agl.launch.agent_class={agent}",
        *(f"+agl.launch.env_map.{name}={path}" for name, path in env_map.items()),
        f"agl.launch.timeout_seconds={timeout_s}",
        f"agl.state_dir={out / 'state'}",
        f"agl.engines.weights_dir={out / 'weights'}",
        f"agl.trajectory_log={out / 'trajectories.jsonl'}",
        "agl.progress=false",
        f"data.train_files={tasks}",
        "data.shuffle=false",
        f"data.train_batch_size={tasks_per_step}",
        f"data.max_prompt_length={prompt_length}",
        "actor_rollout_ref.rollout.n=4",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        f"actor_rollout_ref.model.path={engine.model_dir}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={tasks_per_step}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out / 'checkpoints'}",
    ]


@dataclass
class TrainerRun:
    returncode: int
    output: str
    metrics: list[dict[str, Any]]
    weights_dir: Path
    trajectories: Path

    @classmethod
    def read(cls, returncode: int, output: str, out: Path) -> TrainerRun:
        """What a run writing under `out` left there (metrics.jsonl: verl's file logger)."""
        metrics = out / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        return cls(returncode, output, records, out / "weights", out / "trajectories.jsonl")

    def step(self, n: int) -> dict[str, Any]:
        return next(r["data"] for r in self.metrics if r["step"] == n)


def load_weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    assert files, f"no weights in {directory}"
    tensors: dict[str, Any] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def run_trainer(
    stack: Stack,
    engine: Engine,
    run_id: str,
    tasks: Path,
    *,
    steps: int,
    lr: float,
    model: str = MODEL,
    extra: Sequence[str] = (),
) -> TrainerRun:
    """The installed `agl-trainer`, as a user starts it, for a small run under stack.root/run_id; `extra`: more
    overrides."""
    out = stack.root / run_id
    out.mkdir()
    # Each run starts from the weights its trainer loads: an earlier run's pushes would otherwise still be served
    # (after the 3-step run learned parity, the zero-lr run's groups often all scored 1 and had nothing to learn).
    engine.restore_base_weights()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    argv += [*trainer_overrides(engine, run_id, tasks, out, steps=steps, lr=lr, model=model), *extra]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    if engine.api_key:  # as compose gives the trainer the stack's AGL_ENGINE_API_KEY
        env["AGL_ENGINE_API_KEY"] = engine.api_key
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    return TrainerRun.read(proc.returncode, proc.stdout + proc.stderr, out)


def max_weight_change(before: Path, after: Path) -> float:
    old, new = load_weights(before), load_weights(after)
    shared = set(old) & set(new)
    assert shared, "the trainer's weight file shares no tensor name with the model"
    return max(float((new[name] - old[name]).abs().max()) for name in shared)


async def endpoint_version(stack: Stack) -> int:
    async with stack.client() as client:
        return max(e.version for e in await client.list_models(MODEL))
