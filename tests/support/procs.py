"""Start real AGL services as subprocesses on loopback and wait until they answer.

Each process's output goes to a log file; when a start fails, the log is part of the error so that a red
test says why. A process that exits while its readiness is awaited fails the start within a poll (0.1 s), with
the end of its log, instead of when the readiness check gives up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]


def processes_mentioning(text: str) -> list[int]:
    """Pids (but this one) whose command line or environment mention text: what a run that carries a folder's
    path into all of its processes left running."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_grpc_ready(address: str, timeout_s: float = 20.0, service: str = "") -> None:
    """Waits until the gRPC health service at address reports SERVING."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as err:
                last = err
            time.sleep(0.05)
    raise TimeoutError(f"gRPC server at {address} not SERVING after {timeout_s}s: {last}")


def wait_http_ready(url: str, timeout_s: float = 20.0) -> None:
    """Waits until GET url answers 200."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError) as err:
            last = err
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 after {timeout_s}s: {last}")


@dataclass
class ServiceProcess:
    """A running service subprocess."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    address: str = ""
    port: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    child["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + child.get("PYTHONPATH", "")
    child["PYTHONUNBUFFERED"] = "1"
    child.update(env or {})
    return child


@contextlib.contextmanager
def start_service(
    argv: Sequence[str],
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    ready: Callable[[ServiceProcess], None] | None = None,
    address: str = "",
    port: int = 0,
    log_dir: Path | None = None,
    stop_timeout_s: float = 15.0,
) -> Iterator[ServiceProcess]:
    """Runs argv as a subprocess until the block ends; `ready` raises until the service answers."""
    directory = Path(log_dir or tempfile.mkdtemp(prefix=f"agl-{name}-"))
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"{name}-{port or os.getpid()}-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            list(argv), stdout=log_file, stderr=subprocess.STDOUT, env=_child_env(env), cwd=REPO_ROOT
        )
    service = ServiceProcess(name=name, argv=list(argv), proc=proc, log_path=log_path, address=address, port=port)
    try:
        if ready is not None:
            try:
                _await_ready(service, ready)
            except Exception as err:
                service.kill()
                log_text = service.log_text()
                raise RuntimeError(f"{name} did not become ready: {err}\n--- {name} log ---\n{log_text}") from err
        yield service
    finally:
        service.terminate(stop_timeout_s)


def _await_ready(service: ServiceProcess, ready: Callable[[ServiceProcess], None]) -> None:
    """ready(service) run beside a watch on the process: RuntimeError as soon as the process exits first (the
    readiness check itself goes on in its thread until it gives up; nothing waits for it)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            ready(service)
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=run, name=f"ready-{service.name}", daemon=True)
    thread.start()
    while not outcome:
        if not service.alive() and not outcome:
            raise RuntimeError(f"{service.name} exited with {service.proc.returncode} during start-up")
        thread.join(0.1)
    if outcome[0] is not None:
        raise outcome[0]


def ledger_argv(port: int, store: str = "memory", key: str | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "services.ledger", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--store", store, "--metrics-port", "0"]
    if key:
        argv += [f"--key={key}"]  # a key may begin with "-" (a run folder's key from before hex keys)
    return argv + list(extra_args)


@contextlib.contextmanager
def start_ledger(
    store: str = "memory",
    key: str | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    log_dir: Path | None = None,
) -> Iterator[ServiceProcess]:
    """The real ledger on 127.0.0.1; `address` is host:port."""
    port = port or free_port()
    address = f"127.0.0.1:{port}"

    def ready(service: ServiceProcess) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not service.alive():
                raise RuntimeError(f"ledger exited with {service.proc.returncode}")
            try:
                wait_grpc_ready(address, timeout_s=0.5)
                return
            except TimeoutError:
                continue
        raise TimeoutError("ledger not SERVING after 30s")

    with start_service(
        ledger_argv(port, store, key, extra_args),
        name="ledger",
        ready=ready,
        address=address,
        port=port,
        log_dir=log_dir,
    ) as service:
        yield service


@contextlib.contextmanager
def start_proxy_for_engine(
    ledger_address: str, model_name: str, key: str, extra_args: Sequence[str] = ()
) -> Iterator[str]:
    """The real proxy on 127.0.0.1 in front of the ledger at ledger_address, serving model_name; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--ledger", ledger_address, "--model-name", model_name, "--heartbeat", "0.5", *extra_args]
    url = f"http://127.0.0.1:{port}"
    with start_service(
        argv, name="proxy", port=port, env={"AGL_KEY": key}, ready=lambda _: wait_http_ready(f"{url}/healthz")
    ):
        yield url
