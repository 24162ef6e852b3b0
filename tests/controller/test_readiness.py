"""The controller's /readyz tells the truth (real controller and ledger processes): 503 naming the ledger while it is
down or refuses the key, 200 once the controller is subscribed to the queue; /healthz stays 200 throughout."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.procs import REPO_ROOT, free_port, start_ledger, start_service, wait_http_ready

from .conftest import KEY


def wait_ready_state(url: str, status: int, ledger_state: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        reply = httpx.get(f"{url}/readyz", timeout=5)
        body = reply.json()
        if reply.status_code == status and body["ledger"] == ledger_state:
            return body
        assert time.monotonic() < deadline, f"/readyz stayed {reply.status_code}: {reply.text}"
        time.sleep(0.1)


def controller_argv(ledger_port: int, port: int, tmp_path: Path) -> list[str]:
    argv = [sys.executable, "-m", "services.controller", "--ledger", f"127.0.0.1:{ledger_port}"]
    argv += ["--proxy-url", "http://127.0.0.1:9", "--controller-id", "ctl-ready", "--log-dir", str(tmp_path / "logs")]
    return [*argv, "--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--ready-check", "0.3"]


def test_readyz_names_a_missing_ledger_then_a_refused_key_and_passes_once_subscribed(tmp_path: Path) -> None:
    ledger_port, port = free_port(), free_port()
    address, url = f"127.0.0.1:{ledger_port}", f"http://127.0.0.1:{port}"
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_service(
        controller_argv(ledger_port, port, tmp_path),
        name="controller",
        port=port,
        env={"AGL_KEY": KEY},
        ready=lambda _: wait_http_ready(f"{url}/healthz"),
        log_dir=tmp_path,
    ) as controller:
        body = wait_ready_state(url, 503, "ledger_unreachable")
        assert address in body["reason"] and "did not answer" in body["reason"], body
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 200
        assert httpx.get(f"{url}/readiness").status_code == 404  # a probe at a wrong path fails

        with start_ledger(store=store, key="not-the-controllers-key", port=ledger_port):
            body = wait_ready_state(url, 503, "ledger_refused_key")
            assert address in body["reason"] and "refused the controller's key" in body["reason"], body
            time.sleep(3.0)  # several checks and watch retries while refused
            assert httpx.get(f"{url}/healthz").status_code == 200
            log = controller.log_text()
        assert "Traceback" not in log, log
        refused = [line for line in log.splitlines() if "refused the controller's key" in line]
        assert len(refused) == 1 and "AGL_KEY" in refused[0], log
        assert len(log.splitlines()) < 30, log

        with start_ledger(store=store, key=KEY, port=ledger_port) as ledger:
            started = time.monotonic()
            body = wait_ready_state(url, 200, "ok")
            assert body["ready"] is True and body["subscribed"] is True, body
            ready_s = time.monotonic() - started
            ledger.kill()
            body = wait_ready_state(url, 503, "ledger_unreachable")
            assert address in body["reason"], body
        assert "Traceback" not in controller.log_text()
    print(f"controller /readyz: 200 {ready_s:.1f}s after the ledger accepted its key")


def test_a_key_refused_at_start_exits_non_zero_with_one_clear_line(tmp_path: Path) -> None:
    with start_ledger(key=KEY) as ledger:
        argv = controller_argv(ledger.port, free_port(), tmp_path)
        env = {"PATH": "/usr/bin:/bin", "AGL_KEY": "not-the-ledger-key"}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    refused = [line for line in output.splitlines() if "refused the controller's key" in line]
    assert len(refused) == 1 and "AGL_KEY" in refused[0] and ledger.address in refused[0], output
