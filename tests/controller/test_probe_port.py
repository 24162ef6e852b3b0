"""The controller's probe port under silent clients (issue 30 finding 15): two hundred connections that send
nothing, and twenty that send half a request head, add no thread each, are closed within the head deadline, and
/healthz answers at once while they are open."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.controller.conftest import Stack, run_controller
from tests.controller.test_template_lanes import wait_ready
from tests.support.slow_clients import check_ops_port


async def test_silent_connections_to_the_probe_port_are_bounded_and_closed(stack: Stack, tmp_path: Path) -> None:
    with run_controller(stack, tmp_path) as controller:
        port = int(controller.metrics_url.rsplit(":", 1)[1].split("/")[0])
        await wait_ready(f"http://127.0.0.1:{port}/readyz")  # started: its own threads are there
        await check_ops_port(controller.process.proc.pid, "127.0.0.1", port, "/healthz")
        async with httpx.AsyncClient(timeout=5) as http:
            metrics = await http.get(controller.metrics_url)
            head = await http.head(f"http://127.0.0.1:{port}/healthz")
            missing = await http.get(f"http://127.0.0.1:{port}/nope")
    assert metrics.status_code == 200 and "agl_controller_launched_total" in metrics.text
    assert head.status_code == 200 and head.content == b""
    assert missing.status_code == 404 and "/readyz" in missing.text
