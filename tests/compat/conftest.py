"""Agent Lightning v1.0's own code against AGL: the published `agentlightning` package runs in its own venv
(.venv-agl1, `make agl1-venv`) as separate processes, and talks HTTP to the real ledger, proxy and controller started
here on loopback with the stand-in engine behind them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import Http, register, run_proxy, run_standin
from tests.support.engine import Engine
from tests.support.procs import REPO_ROOT, ServiceProcess, free_port, start_ledger, start_service, wait_http_ready

KEY = "proxy-test-master-key"  # the proxy fixtures' key (tests.proxy.conftest.KEY)
MODEL = "toy-model"
AGL1_VERSION = "1.0.2"
AGL1_VENV = REPO_ROOT / ".venv-agl1"
AGL1_PYTHON = AGL1_VENV / "bin" / "python"
EXAMPLES = AGL1_VENV / f"agentlightning-{AGL1_VERSION}" / "examples"
CLIENTS = Path(__file__).parent / "v1_clients"


@dataclass
class Agl1:
    """The v1.0 venv: its interpreter, its console scripts, the examples of its source release."""

    python: Path
    bin: Path
    examples: Path

    def env(self, *example_dirs: str) -> dict[str, str]:
        """Environment for a process that runs v1.0's example agents: the examples' folders importable (as the
        examples' own images have them at /app) and this venv's `python` first on PATH (calc_x starts the MCP
        calculator server as `python -m mcp_server_calculator`)."""
        paths = [str(self.examples / name) for name in example_dirs]
        return {
            "PYTHONPATH": os.pathsep.join([*paths, str(REPO_ROOT)]),
            "PATH": os.pathsep.join([str(self.bin), os.environ.get("PATH", "")]),
        }


@pytest.fixture(scope="session")
def agl1() -> Agl1:
    """The v1.0 venv, checked: the published package at the expected version, and its examples."""
    if not AGL1_PYTHON.exists():
        pytest.fail(f"{AGL1_VENV} is missing: build it with `make agl1-venv` (make test does)", pytrace=False)
    version = subprocess.run(
        [str(AGL1_PYTHON), "-c", "import agentlightning; print(agentlightning.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == AGL1_VERSION, f"{AGL1_VENV} has agentlightning {version}, not {AGL1_VERSION}"
    assert (EXAMPLES / "gsm8k" / "gsm8k_agent.py").exists() and (EXAMPLES / "calc_x" / "calc_agent.py").exists()
    return Agl1(AGL1_PYTHON, AGL1_VENV / "bin", EXAMPLES)


@dataclass
class Stack:
    ledger: ServiceProcess
    engine: Http | Engine  # the stand-in, or the real CPU engine (tests.support.engine)
    proxy: Http

    @property
    def engine_address(self) -> str:
        """host:port, the form v1.0's trainer registers (it appends /v1)."""
        return self.engine.url.removeprefix("http://")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The ledger, the stand-in engine and the proxy; the engine is registered by each test's own client."""
    with start_ledger(key=KEY) as ledger, run_standin() as engine, run_proxy(ledger.address) as proxy:
        yield Stack(ledger, engine, proxy)


def registered_stack(stack: Stack) -> Stack:
    register(stack.ledger.address, stack.engine)
    return stack


def v1_env(env: dict[str, str] | None = None) -> dict[str, str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    child.update(env or {})
    child["PYTHONPATH"] = os.pathsep.join([str(CLIENTS), child.get("PYTHONPATH", "")])
    return child


def start_v1(agl1: Agl1, script: str, *args: str) -> subprocess.Popen[str]:
    """One of v1_clients/ started in the v1.0 venv, its stdin and stdout piped (for clients that wait for a go)."""
    argv = [str(agl1.python), str(CLIENTS / script), *args]
    pipe = subprocess.PIPE
    return subprocess.Popen(
        argv, stdin=pipe, stdout=pipe, stderr=subprocess.STDOUT, text=True, env=v1_env(), cwd=REPO_ROOT
    )


def run_v1(agl1: Agl1, script: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 240) -> str:
    """Runs one of v1_clients/ in the v1.0 venv; its output (v1.0's own prints) is returned, a failure raised."""
    done = subprocess.run(
        [str(agl1.python), str(CLIENTS / script), *args],
        capture_output=True,
        text=True,
        env=v1_env(env),
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{output[-6000:]}"
    return output


def run_json(agl1: Agl1, tmp_path: Path, script: str, spec: dict[str, Any] | None, *args: str, **kw: Any) -> Any:
    """run_v1 for a client that reads a JSON spec and writes a JSON answer."""
    out = tmp_path / f"{script}.out.json"
    if spec is not None:
        spec_path = tmp_path / f"{script}.spec.json"
        spec_path.write_text(json.dumps(spec))
        args = (str(spec_path), *args)
    output = run_v1(agl1, script, *args, str(out), **kw)
    answer = json.loads(out.read_text())
    answer["output"] = output  # what v1.0's code printed
    return answer


@contextlib.contextmanager
def v1_controller(agl1: Agl1, stack: Stack, tmp_path: Path, example_dirs: Sequence[str]) -> Iterator[ServiceProcess]:
    """v1.0's own local controller (`agl-controller runner_type=local`, its console script), pointed at the proxy
    with the master key as a v1.0 user points it at agl-server."""
    argv = [str(agl1.bin / "agl-controller"), "runner_type=local", f"agl_server.url={stack.proxy.url}"]
    argv += [f"agl_server.key={KEY}", "local_runner.poll_interval=0.3", "local_runner.maximum_size=8"]
    argv += [f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    with start_service(argv, name="v1-controller", env=agl1.env(*example_dirs), log_dir=tmp_path) as process:
        time.sleep(0.5)
        assert process.alive(), process.log_text()
        yield process


@contextlib.contextmanager
def agl_controller(agl1: Agl1, stack: Stack, tmp_path: Path, example_dirs: Sequence[str]) -> Iterator[ServiceProcess]:
    """AGL's controller (`python -m services.controller`), its agents able to import v1.0's examples."""
    metrics_port = free_port()
    argv = [sys.executable, "-m", "services.controller", "--ledger", stack.ledger.address]
    argv += ["--proxy-url", stack.proxy.url, "--log-dir", str(tmp_path / "agent-logs"), "--kill-grace", "0.5"]
    argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port)]
    env = {**agl1.env(*example_dirs), "AGL_KEY": KEY}
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with start_service(
        argv, name="agl-controller", env=env, ready=lambda _: wait_http_ready(url), log_dir=tmp_path
    ) as process:
        yield process


def http(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.proxy.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
