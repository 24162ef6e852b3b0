"""The services a local run needs, started the way deploy/docker-compose.yaml starts them (services/stack: the same
commands, environment and health checks, on free loopback ports), with the master key on and an engine serving the
model, registered in the ledger. Stopped, in reverse order, on the way out.

An installed AGL starts them from the compose file its wheel carries; the CPU engine runs in an interpreter with
vLLM's CPU build (a checkout's .venv-engine, or AGL_ENGINE_PYTHON: services/engine/launch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, TypeVar

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.stack import local_stack
from services.stack.local_stack import RunningService

from ..errors import CliError
from . import lora as lora_module
from .signals import run_async

KEY_FILE = "key"
# How often a wait on the stack (the smoke rollout, the trainer) looks whether every service still runs.
SERVICE_POLL_S = 0.5

T = TypeVar("T")


@dataclass(frozen=True)
class Stack:
    ledger: str
    key: str
    key_file: Path
    model_name: str
    proxy_url: str
    engine_url: str  # "" when no engine was started (verl's own replicas serve the model)
    console_url: str
    logs: Path
    agent_logs: Path
    # The running services by name (the fault bench restarts them).
    services: Mapping[str, RunningService] = field(default_factory=dict)

    def client(self) -> LedgerClient:
        return LedgerClient(self.ledger, key=self.key)


def write_key(folder: Path) -> tuple[str, Path]:
    """The run's master key: kept in a file only the user can read (the console asks for it), reused on resume."""
    path = folder / KEY_FILE
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key, path
    folder.mkdir(parents=True, exist_ok=True)
    # Hex, not url-safe base64: one key in 64 began with '-', which a command line takes for an option (--key -x).
    key = secrets.token_hex(18)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return key, path


def model_name() -> str:
    """The model name the stack's proxy serves and its runs train (the compose file's AGL_MODEL_NAME)."""
    return local_stack.load_compose({**os.environ, "AGL_KEY": "-"}, ["engine", "standin", "console"])["proxy"].env[
        "AGL_MODEL_NAME"
    ]


async def register_engine(ledger: str, key: str, model_name: str, engine_url: str = "") -> None:
    """Replaces the model's endpoints with engine_url (with none when it is empty)."""
    async with LedgerClient(ledger, key=key) as client:
        # The store outlives a launch (resume): endpoints registered before point at ports that are gone now.
        await client.delete_models([model_pb2.ModelEndpointKey(model_name=model_name)])
        if engine_url:
            await client.register_models([model_pb2.ModelEndpoint(model_name=model_name, endpoint=engine_url)])


async def load_adapter(engine_url: str, name: str, adapter: Path) -> None:
    from services.engine.control import EngineControl, EngineError

    try:
        async with EngineControl(engine_url) as engine:
            await engine.load_adapter(name, adapter)
    except EngineError as err:
        raise CliError(f"the engine did not load the start adapter {adapter}: {err}") from None


@contextlib.contextmanager
def running_stack(
    folder: Path,
    *,
    model_dir: Path | None,
    max_model_len: int,
    concurrency: int,
    agent_path: list[str],
    out: TextIO,
    tool_call_parser: str = "hermes",
    console: bool = True,
    lora: tuple[int, int] = (0, 0),
    ports: Mapping[tuple[str, int], int] | None = None,
    standin: bool = False,
) -> Iterator[Stack]:
    """Ledger (SQLite under folder/stack), proxy, controller, the CPU engine when model_dir is given, and the
    console; the agent's import path goes to the controller. `lora` (rank, alpha): the engine serves the base model
    as `<model>-base` and loads adapters of that rank under the model's name, starting with one that changes
    nothing (train/lora.py). `standin`: the stand-in engine (services/standin, vLLM-shaped, no model) serves the
    model instead (agl try). `ports`: local ports to use by (service, container port); free ones otherwise. A
    service that exits before it is healthy stops the start at once (CliError with the end of its log)."""
    key, key_file = write_key(folder)
    engine = "engine" if model_dir else "standin" if standin else ""
    wanted = ["ledger", "proxy", "controller", *([engine] if engine else []), *(["console"] if console else [])]
    variables = {**os.environ, "AGL_KEY": key}
    specs = local_stack.load_compose(variables, ["engine", "standin", "console"])
    specs = {name: specs[name] for name in wanted}
    data_dir = folder / "stack"
    logs = folder / "logs"
    agent_logs = logs / "agents"
    overrides: dict[str, dict[str, str]] = {
        "controller": {
            "AGL_CONTROLLER_LOG_DIR": str(agent_logs),
            "AGL_CONTROLLER_MAX_CONCURRENCY": str(max(1, concurrency)),
        },
    }
    if model_dir:
        overrides["engine"] = {
            "AGL_ENGINE_MODEL_DIR": str(model_dir),
            "AGL_ENGINE_MAX_MODEL_LEN": str(max_model_len),
            "AGL_ENGINE_TOOL_CALL_PARSER": tool_call_parser,
        }
    lora_rank = lora[0]
    ledger_port = int(specs["ledger"].env["AGL_LEDGER_PORT"])
    model_name = specs["proxy"].env["AGL_MODEL_NAME"]
    if model_dir and lora_rank:
        overrides["engine"]["AGL_ENGINE_LORA_RANK"] = str(lora_rank)
        overrides["engine"]["AGL_ENGINE_SERVED_MODEL_NAME"] = lora_module.engine_model_name(model_name)
    plans = local_stack.localize(specs, data_dir, overrides, ports)
    # The controller's agents import the user's modules from where agl runs (the agent runner follows PYTHONPATH).
    user_path = os.environ.get("PYTHONPATH", "")
    parts = [*agent_path, *user_path.split(os.pathsep)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in parts if p))
    note = " (the engine takes ~40 s)" if model_dir else ""
    port_of = {"engine": "AGL_ENGINE_PORT", "standin": "AGL_STANDIN_PORT"}
    out.write(f"starting {', '.join(wanted)}{note}; logs in {logs}\n")
    out.flush()

    def register(name: str, running: Mapping[str, RunningService]) -> None:
        # Before the controller starts: a resumed run's queued rollouts would otherwise run at once against the
        # endpoints the ledger still holds from the last launch (gone), and fail as the agent's own errors. On GPUs
        # the trainer registers verl's replicas itself.
        if name == "ledger":
            run_async(register_engine(running["ledger"].address(ledger_port), key, model_name))
        elif name == engine:
            port = int(specs[engine].env[port_of[engine]])
            url = f"http://{running[engine].address(port)}/v1"
            if lora_rank:  # the run's model name exists on the engine before the first push (the smoke rollout)
                assert model_dir is not None
                start = lora_module.write_start_adapter(model_dir, folder / "state" / "start-adapter", *lora)
                run_async(load_adapter(url.removesuffix("/v1"), model_name, start))
            run_async(register_engine(running["ledger"].address(ledger_port), key, model_name, url))

    order = local_stack.start_order(specs)
    if engine:
        order = [name for name in order if name != "controller"]
        order.insert(order.index(engine) + 1, "controller")
    try:
        # The controller stops first: it ends the agents still running as CONTROLLER_SHUTDOWN, an infrastructure
        # failure the resumed trainer retries. Stopped after the proxy or the engine, their calls would fail first
        # and they would end as the agent's own failures (scores).
        with local_stack.run_stack(
            plans, order, logs, health_timeout_s=300.0, stop_first=["controller"], when_healthy=register
        ) as running:
            ledger = running["ledger"].address(ledger_port)
            proxy_url = "http://" + running["proxy"].address(int(specs["proxy"].env["AGL_PROXY_PORT"]))
            engine_url = ""
            if engine:
                engine_url = f"http://{running[engine].address(int(specs[engine].env[port_of[engine]]))}/v1"
            console_url = ""
            if console:
                port = int(specs["console"].env["AGL_CONSOLE_PORT"])
                console_url = f"http://{running['console'].address(port)}/"
            yield Stack(
                ledger, key, key_file, model_name, proxy_url, engine_url, console_url, logs, agent_logs, running
            )
    except local_stack.StackError as err:
        raise CliError(f"a service did not start: {err}") from None
    finally:
        os.environ["PYTHONPATH"] = user_path
        if not user_path:
            os.environ.pop("PYTHONPATH", None)


def check_services(stack: Stack) -> None:
    """CliError naming the service that stopped (its exit status and the end of its log), if one did: a wait on the
    stack ends within a poll of a service's death instead of at its own deadline."""
    problem = local_stack.exited(stack.services)
    if problem:
        raise CliError(f"a service stopped: {problem}")


async def while_services_run(stack: Stack, work: Awaitable[T]) -> T:
    """work's result, or CliError (check_services) as soon as a service of the stack stops; work is then cancelled."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=SERVICE_POLL_S)
            if done:
                return task.result()
            check_services(stack)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    return local_stack.child_environment(extra)
