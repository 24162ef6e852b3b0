"""The services `agl train` starts (and `make demo`, through the same session code): a service that dies at start
is seen within seconds, named, with the end of its log; every service listens on loopback unless configured."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from services.cli.errors import CliError
from services.cli.train.stack import running_stack, while_services_run
from services.controller.config import load_config as controller_config
from services.ledger.config import parse_args as ledger_config
from services.proxy.config import parse_config as proxy_config
from tests.support.procs import start_service

pytestmark = pytest.mark.timeout(300)


def test_a_controller_whose_port_is_taken_stops_the_start_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = io.StringIO()
        begun = time.monotonic()
        stack = running_stack(
            tmp_path,
            model_dir=None,
            max_model_len=512,
            concurrency=1,
            agent_path=[],
            out=out,
            console=False,
            ports={("controller", 9465): port},
        )
        with pytest.raises(CliError) as caught, stack:
            pytest.fail("the stack started with its controller's port taken")
        took = time.monotonic() - begun
    message = str(caught.value)
    assert message.startswith("a service did not start: controller exited with 1")
    assert "Address already in use" in message and str(port) in message  # the end of its log
    assert "ledger, proxy, controller" in out.getvalue()
    # The ledger and the proxy start first (seconds each); the stack's health wait is 300 s, a smoke rollout's minutes.
    assert took < 60, took


def test_a_wait_on_the_stack_ends_within_a_poll_of_a_services_death(tmp_path: Path) -> None:
    out = io.StringIO()
    with running_stack(tmp_path, model_dir=None, max_model_len=512, concurrency=1, agent_path=[], out=out) as stack:
        assert set(stack.services) == {"ledger", "proxy", "controller", "console"}
        os.killpg(stack.services["proxy"].proc.pid, signal.SIGKILL)
        begun = time.monotonic()
        with pytest.raises(CliError) as caught:
            asyncio.run(while_services_run(stack, asyncio.sleep(120)))  # a smoke rollout would wait minutes
        took = time.monotonic() - begun
    assert took < 5, took
    assert str(caught.value).startswith("a service stopped: proxy exited with -9; the end of its log")


def test_a_test_service_that_exits_at_start_fails_its_start_at_once(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('cannot bind: port taken'); sys.exit(3)"]
    begun = time.monotonic()
    service = start_service(argv, name="dies", ready=lambda _: time.sleep(30), log_dir=tmp_path)
    with pytest.raises(RuntimeError) as caught, service:
        pytest.fail("started")
    assert time.monotonic() - begun < 10  # not the 30 s its readiness check would wait
    assert "dies exited with 3 during start-up" in str(caught.value)
    assert "cannot bind: port taken" in str(caught.value)


def test_every_service_listens_on_loopback_unless_configured() -> None:
    assert ledger_config([], {}).host == "127.0.0.1"
    assert proxy_config([], {"AGL_MODEL_NAME": "m"}).host == "127.0.0.1"
    assert controller_config([], {}).metrics_host == "127.0.0.1"
    assert ledger_config([], {"AGL_LEDGER_HOST": "0.0.0.0"}).host == "0.0.0.0"
