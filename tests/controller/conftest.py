"""Real ledger, proxy and stand-in engine on loopback; controllers started per test as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from services._gen.agl.v1 import model_pb2, rollout_pb2
from services.client import LedgerClient
from tests.controller.k8s_standin import K8sStandin
from tests.support.procs import ServiceProcess, free_port, start_ledger, start_service, wait_http_ready

KEY = "controller-test-master-key"
MODEL = "toy-model"
AGENTS = Path(__file__).parent / "agents"
TERMINAL = (rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED)


@dataclass
class Stack:
    ledger: ServiceProcess
    proxy_url: str


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The ledger, a stand-in engine registered as the model's endpoint, and the proxy, all with a master key."""
    with start_ledger(key=KEY) as ledger:
        engine_port, proxy_port = free_port(), free_port()
        engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
        engine_argv = [sys.executable, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(engine_port)]
        with start_service(
            [*engine_argv, "--model", MODEL],
            name="standin",
            port=engine_port,
            ready=lambda _: wait_http_ready(f"{engine_url}/health"),
        ):
            endpoint = model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{engine_url}/v1", version=1)
            asyncio.run(_call(ledger.address, "register_models", [endpoint]))
            proxy_argv = [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy_port)]
            proxy_argv += ["--ledger", ledger.address, "--model-name", MODEL]
            with start_service(
                proxy_argv,
                name="proxy",
                port=proxy_port,
                env={"AGL_KEY": KEY},
                ready=lambda _: wait_http_ready(f"{proxy_url}/healthz"),
            ):
                yield Stack(ledger, proxy_url)


async def _call(address: str, method: str, *args: Any) -> Any:
    async with LedgerClient(address, KEY) as client:
        return await getattr(client, method)(*args)


@pytest.fixture
async def ledger(stack: Stack) -> AsyncIterator[LedgerClient]:
    """A client of the shared ledger; every rollout is deleted afterwards so tests do not see each other's."""
    async with LedgerClient(stack.ledger.address, KEY) as client:
        yield client
        leftovers = await client.list_rollouts()
        if leftovers:
            await client.delete_rollouts([r.rollout_id for r in leftovers])


@dataclass
class Controller:
    process: ServiceProcess
    controller_id: str
    log_dir: Path
    metrics_url: str


@contextlib.contextmanager
def run_controller(
    stack: Stack,
    tmp_path: Path,
    *,
    controller_id: str = "",
    args: Sequence[str] = (),
    log_dir: Path | None = None,
    key: str | None = KEY,
    ledger_address: str = "",
) -> Iterator[Controller]:
    """`python -m services.controller` against the shared ledger and proxy; ready once /metrics answers.
    `ledger_address`: where it reaches the ledger, when not directly (a relay)."""
    controller_id = controller_id or f"ctl-{uuid.uuid4().hex[:8]}"
    log_dir = log_dir or tmp_path / f"logs-{controller_id}"
    metrics_port = free_port()
    argv = [sys.executable, "-m", "services.controller", "--ledger", ledger_address or stack.ledger.address]
    argv += ["--proxy-url", stack.proxy_url, "--controller-id", controller_id, "--log-dir", str(log_dir)]
    argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--kill-grace", "0.5", *args]
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    with start_service(
        argv,
        name=f"controller-{controller_id}",
        port=metrics_port,
        env={"AGL_KEY": key} if key else {},
        ready=lambda _: wait_http_ready(metrics_url),
        log_dir=tmp_path,
    ) as process:
        yield Controller(process, controller_id, log_dir, metrics_url)


def spec(
    *,
    command: Sequence[str] = (),
    agent_class: str = "",
    env_map: dict[str, str] | None = None,
    input_value: Any = None,
    timeout_s: float = 0.0,
    job_template: str = "",
    is_train: bool = True,
    rollout_id: str = "",
    labels: dict[str, str] | None = None,
) -> rollout_pb2.RolloutSpec:
    config = rollout_pb2.RolloutConfig(timeout_seconds=timeout_s)
    config.local.command.extend(command)
    config.local.agent_class = agent_class
    config.local.env_map.update(env_map or {})
    config.k8s.job_template = job_template
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id or f"ro-{uuid.uuid4().hex[:12]}",
        input_json=json.dumps(input_value if input_value is not None else {}),
        is_train=is_train,
        config=config,
        metadata=rollout_pb2.RolloutMetadata(labels=labels or {}),
    )


def agent_command(*args: str) -> list[str]:
    return [sys.executable, str(AGENTS / "tools.py"), *args]


async def wait_for(
    client: LedgerClient, rollout_ids: Iterable[str], states: Sequence[int] = TERMINAL, timeout_s: float = 30.0
) -> dict[str, rollout_pb2.Rollout]:
    """Waits until every rollout is in one of `states`; returns them by id."""
    ids = set(rollout_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        found = {r.rollout_id: r for r in await client.list_rollouts() if r.rollout_id in ids}
        if len(found) == len(ids) and all(r.status.state in states for r in found.values()):
            return found
        if time.monotonic() > deadline:
            summary = {rid: rollout_pb2.RolloutState.Name(r.status.state) for rid, r in found.items()}
            raise TimeoutError(f"rollouts not in {states} after {timeout_s}s: {summary}")
        await asyncio.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def host_pids(pid_file: Path, timeout_s: float = 20.0) -> list[int]:
    """The host's pids of the processes an agent listed in pid_file (tools.spawn_family), read while they run."""
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"the agent never wrote {pid_file}"
        time.sleep(0.05)
    pids = [int(p) for p in pid_file.read_text().split()]
    return in_host(Path(f"{pid_file}.ns").read_text(), pids)


def in_host(namespace: str, pids: list[int]) -> list[int]:
    """The host's pids of live processes known by their pids in a PID namespace (`pid:[inode]`, as an agent reads
    /proc/self/ns/pid): a contained agent lists its own namespace's. Each process's /proc/PID/status on the host
    (NSpid: its pid in every namespace down to its own) translates them."""
    if namespace == os.readlink("/proc/self/ns/pid"):
        return pids
    inside: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        inside[int(nspid[-1])] = int(entry.name)
    assert set(pids) <= set(inside), (pids, inside)
    return [inside[pid] for pid in pids]


def metric(text: str, name: str) -> float:
    """The value of one sample line (name with labels exactly as exposed) in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def read_metrics(url: str, expected: dict[str, float], timeout_s: float = 10.0) -> str:
    """The controller's /metrics once the expected samples show (the ledger may see a report a moment before)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        if all(metric(text, name) == value for name, value in expected.items()) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


RBAC = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "controller-rbac.yaml"


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[K8sStandin]:
    """The stand-in API server, granting the controller exactly the Role in deploy/k8s/controller-rbac.yaml."""
    [role] = [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc["kind"] == "Role"]
    with K8sStandin(rbac_rules=role["rules"]) as standin:
        yield standin
        assert standin.forbidden == []
