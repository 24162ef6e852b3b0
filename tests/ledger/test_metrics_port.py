"""The ledger's metrics port under silent clients (issue 30 finding 15): two hundred connections that send nothing,
and twenty that send half a request head, add no thread each, are closed within the head deadline, and a scrape
answers at once while they are open."""

from __future__ import annotations

import httpx

from tests.support.procs import free_port, start_ledger
from tests.support.slow_clients import check_ops_port


async def test_silent_connections_to_the_metrics_port_are_bounded_and_closed(tmp_path) -> None:
    port = free_port()
    with start_ledger(log_dir=tmp_path, extra_args=["--metrics-port", str(port)]) as ledger:
        await check_ops_port(ledger.proc.pid, "127.0.0.1", port, "/metrics")
        async with httpx.AsyncClient(timeout=5) as http:
            scrape = await http.get(f"http://127.0.0.1:{port}/metrics", headers={"accept-encoding": "gzip"})
            elsewhere = await http.get(f"http://127.0.0.1:{port}/")
            posted = await http.post(f"http://127.0.0.1:{port}/metrics", content=b"x")
            huge_head = await http.get(f"http://127.0.0.1:{port}/metrics", headers={"x-pad": "a" * 20000})
    assert scrape.status_code == 200 and scrape.headers["content-encoding"] == "gzip"
    assert "agl_ledger_events_appended_total" in scrape.text
    assert elsewhere.status_code == 404 and "/metrics" in elsewhere.text
    assert posted.status_code == 405 and "GET only" in posted.text
    assert huge_head.status_code == 431
