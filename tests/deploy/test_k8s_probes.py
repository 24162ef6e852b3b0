"""The probes of deploy/k8s, run the way kubelet runs them against the real ledger, proxy and controller on loopback.

Each probe is taken from the manifest as written (path, named or numbered port, gRPC service) and sent to the process
that serves that container port here. Readiness must pass while everything is up and fail while the service cannot
work (the ledger's store cannot commit; the proxy's and the controller's ledger is gone), while liveness keeps
passing. So a probe at a path nothing serves fails, and so does a readiness probe pointed at liveness.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from tests.deploy.conftest import K8S
from tests.support.procs import ServiceProcess, free_port, start_ledger, start_service, wait_http_ready

KEY = "probe-test-key"
WORKLOADS = {"agl-ledger": "ledger.yaml", "agl-proxy": "proxy.yaml", "agl-controller": "controller.yaml"}


def container(name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((K8S / WORKLOADS[name]).read_text())
    kinds = ("Deployment", "StatefulSet")
    workload = next(d for d in docs if d and d["kind"] in kinds and d["metadata"]["name"] == name)
    return workload["spec"]["template"]["spec"]["containers"][0]


@dataclass
class Target:
    """A container of a manifest and the local process standing for it: container port -> local port."""

    spec: dict[str, Any]
    ports: dict[int, int]

    def local_port(self, port: int | str) -> int:
        if isinstance(port, str):
            port = next(p["containerPort"] for p in self.spec["ports"] if p["name"] == port)
        return self.ports[port]


def probe(target: Target, kind: str) -> str:
    """Runs the container's readinessProbe or livenessProbe once; "" when it passes, else why it failed."""
    spec = target.spec[kind]
    if "httpGet" in spec:
        get = spec["httpGet"]
        url = f"http://127.0.0.1:{target.local_port(get['port'])}{get['path']}"
        try:
            reply = httpx.get(url, timeout=spec.get("timeoutSeconds", 1) + 1)
        except httpx.HTTPError as err:
            return f"GET {get['path']}: {err}"
        return "" if 200 <= reply.status_code < 400 else f"GET {get['path']}: {reply.status_code} {reply.text[:200]}"
    if "grpc" in spec:
        service = spec["grpc"].get("service", "")
        address = f"127.0.0.1:{target.local_port(spec['grpc']['port'])}"
        with grpc.insecure_channel(address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=spec.get("timeoutSeconds", 1) + 1
                )
            except grpc.RpcError as err:
                return f"grpc health {service!r}: {err.code().name}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return "" if status == "SERVING" else f"grpc health {service!r}: {status}"
    pytest.fail(f"{kind} of {target.spec['name']}: neither httpGet nor grpc: {spec}")


def wait_probe(target: Target, kind: str, passes: bool, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        failure = probe(target, kind)
        if (failure == "") == passes:
            return failure
        assert time.monotonic() < deadline, f"{target.spec['name']} {kind} still {failure or 'passing'}"
        time.sleep(0.1)


@dataclass
class Stack:
    ledger: Target
    proxy: Target
    controller: Target
    ledger_process: ServiceProcess
    db: Path

    @property
    def ledger_address(self) -> str:
        return self.ledger_process.address


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    ledger_spec, proxy_spec, controller_spec = (container(n) for n in WORKLOADS)
    db = tmp_path / "ledger.db"
    ledger_args = ["--store-stall-seconds", "0.5"]
    with start_ledger(store=f"sqlite:{db}", key=KEY, extra_args=ledger_args) as ledger:
        proxy_port, controller_port = free_port(), free_port()
        proxy_argv = [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy_port)]
        proxy_argv += ["--ledger", ledger.address, "--model-name", "m", "--heartbeat", "0.5"]
        controller_argv = [sys.executable, "-m", "services.controller", "--ledger", ledger.address]
        controller_argv += ["--proxy-url", f"http://127.0.0.1:{proxy_port}", "--log-dir", str(tmp_path / "logs")]
        controller_argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(controller_port)]
        controller_argv += ["--ready-check", "0.3", "--controller-id", "ctl-probes"]
        with (
            start_service(
                proxy_argv,
                name="proxy",
                port=proxy_port,
                env={"AGL_KEY": KEY},
                ready=lambda _: wait_http_ready(f"http://127.0.0.1:{proxy_port}/healthz"),
                log_dir=tmp_path,
            ),
            start_service(
                controller_argv,
                name="controller",
                port=controller_port,
                env={"AGL_KEY": KEY},
                ready=lambda _: wait_http_ready(f"http://127.0.0.1:{controller_port}/healthz"),
                log_dir=tmp_path,
            ),
        ):
            yield Stack(
                Target(ledger_spec, {50051: ledger.port}),
                Target(proxy_spec, {8080: proxy_port}),
                Target(controller_spec, {9465: controller_port}),
                ledger,
                db,
            )
            ledger.kill()  # the proxy and the controller then stop on a dead ledger, as they would in a cluster


def test_every_probe_passes_on_a_working_stack_and_readiness_fails_while_the_service_cannot_work(stack: Stack) -> None:
    targets = {"ledger": stack.ledger, "proxy": stack.proxy, "controller": stack.controller}
    for target in targets.values():
        wait_probe(target, "readinessProbe", passes=True)
        assert probe(target, "livenessProbe") == ""

    # The ledger's store cannot commit (its SQLite file locked by another process while a write waits).
    async def append_while_locked() -> None:
        async with LedgerClient(stack.ledger_address, KEY) as client:
            spec = rollout_pb2.RolloutSpec(rollout_id="ro-probe", input_json="{}")
            await client.create_rollouts([spec])
            other = sqlite3.connect(stack.db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            try:
                event = event_pb2.Event(rollout_id="ro-probe", attempt_id="", event_type="note", data_json="{}")
                # allow_terminal: the stack's controller fails this command-less rollout at once; only the write
                # (held up by the lock) matters here.
                append = asyncio.create_task(client.append_events([event], allow_terminal=True, timeout_s=30))
                why = await asyncio.to_thread(wait_probe, stack.ledger, "readinessProbe", False)
                assert "NOT_SERVING" in why, why
                assert probe(stack.ledger, "livenessProbe") == ""
            finally:
                other.execute("ROLLBACK")
                other.close()
            await append
        await asyncio.to_thread(wait_probe, stack.ledger, "readinessProbe", True)

    asyncio.run(append_while_locked())


def test_proxy_and_controller_readiness_fail_without_their_ledger_while_liveness_passes(stack: Stack) -> None:
    for target in (stack.proxy, stack.controller):
        wait_probe(target, "readinessProbe", passes=True)
    stack.ledger_process.kill()  # kubelet would now take both out of service and leave them running
    for target in (stack.proxy, stack.controller):
        why = wait_probe(target, "readinessProbe", passes=False)
        assert "503" in why, why
        assert probe(target, "livenessProbe") == ""
    with start_ledger(store=f"sqlite:{stack.db}", key=KEY, port=stack.ledger_process.port):
        for target in (stack.proxy, stack.controller):
            wait_probe(target, "readinessProbe", passes=True)
