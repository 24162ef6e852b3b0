"""Console benchmark: page server time over 10,000 stored rollouts, change-to-browser latency, idle load on the ledger.

Run: .venv/bin/python bench/console_bench.py [--rollouts 10000] [--rounds 30]

A real ledger and the installed `agl-console` run as subprocesses on loopback.
- Page time: the console's own Server-Timing (the handler's whole time: reading the mirror and rendering), and the
  client's round trip, for the rollouts page (100 rows, and 1000 rows with --page-size 1000 equivalent via state
  filter) and the overview, with N rollouts stored.
- Live latency: from UpdateRolloutStatus(succeeded) returning to the console's server-sent event arriving at a
  client, plus the page's re-fetch of its main part (what an open browser does on that notice, after its 200 ms
  coalescing delay).
- Idle load: the ledger's CPU seconds (from /proc/<pid>/stat) over a quiet window with the console attached and an
  open event stream, against the same window with no console.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services._gen.agl.v1 import rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tests.support.procs import free_port, start_ledger  # noqa: E402

KEY = "bench-key"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError("agl-console exited")
            try:
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("console not ready")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_ledger(key=KEY, log_dir=Path(tmp)) as ledger:
        ledger_pid = ledger.proc.pid
        async with LedgerClient(ledger.address, KEY) as client:
            # Idle baseline: the ledger alone.
            before = cpu_seconds(ledger_pid)
            await asyncio.sleep(args.idle_s)
            alone = cpu_seconds(ledger_pid) - before

            batch = 1000
            for start in range(0, args.rollouts, batch):
                specs = [
                    rollout_pb2.RolloutSpec(
                        rollout_id=f"b{i}",
                        input_json='{"question": "What is 6 * 7?"}',
                        metadata=rollout_pb2.RolloutMetadata(labels={"agl_run": "bench", "agl_step": str(i // 64)}),
                    )
                    for i in range(start, min(start + batch, args.rollouts))
                ]
                await client.create_rollouts(specs)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
            env.update({"AGL_LEDGER_ADDR": ledger.address, "AGL_KEY": KEY, "AGL_LOG_LEVEL": "WARNING"})
            console = subprocess.Popen([str(Path(sys.executable).parent / "agl-console"), "--port", str(port)], env=env)
            try:
                await wait_ready(url, console)
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    await http.post("/login", data={"key": KEY, "next": "/"})
                    print(f"== {args.rollouts} rollouts stored; console pages ({args.rounds} rounds each)")
                    for label, path in (
                        ("rollouts page, 100 rows", "/rollouts"),
                        ("rollouts page, run filter", "/rollouts?run=bench"),
                        ("rollouts page 50 (deep)", "/rollouts?page=50"),
                        ("overview", "/"),
                    ):
                        server: list[float] = []
                        client_ms: list[float] = []
                        for _ in range(args.rounds):
                            started = time.perf_counter()
                            reply = await http.get(path)
                            client_ms.append((time.perf_counter() - started) * 1000)
                            assert reply.status_code == 200, reply.status_code
                            server.append(float(reply.headers["server-timing"].split("dur=")[1]))
                        print(
                            f"{label:<28} server p50 {statistics.median(server):6.2f} ms"
                            f"  p90 {pct(server, 0.9):6.2f} ms  | round trip p50 {statistics.median(client_ms):6.2f} ms"
                            f"  p90 {pct(client_ms, 0.9):6.2f} ms"
                        )

                    # Live latency: terminal change -> SSE notice -> the page's fragment re-fetch.
                    notice_ms: list[float] = []
                    total_ms: list[float] = []
                    async with http.stream("GET", "/events") as stream:
                        lines = stream.aiter_lines()
                        await lines.__anext__()  # retry: line
                        for i in range(args.rounds):
                            rid = f"b{i}"
                            await client.update_status(rid, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="a1")
                            while True:  # drain the running notice
                                line = await lines.__anext__()
                                if line.startswith("data:") and f'"{rid}"' in line:
                                    break
                            await client.update_status(rid, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
                            started = time.perf_counter()
                            while True:
                                line = await lines.__anext__()
                                if line.startswith("data:") and f'"{rid}"' in line and "succeeded" in line:
                                    break
                            notice_ms.append((time.perf_counter() - started) * 1000)
                            await http.get(f"/rollouts/{rid}", headers={"X-Console-Fragment": "1"})
                            total_ms.append((time.perf_counter() - started) * 1000)
                        print(
                            f"terminal change -> SSE notice p50 {statistics.median(notice_ms):.2f} ms  "
                            f"p90 {pct(notice_ms, 0.9):.2f} ms; + page re-fetch p50 {statistics.median(total_ms):.2f}"
                            f" ms  p90 {pct(total_ms, 0.9):.2f} ms (the browser adds its 200 ms coalescing delay)"
                        )

                        await asyncio.sleep(1.0)
                        before = cpu_seconds(ledger_pid)
                        console_before = cpu_seconds(console.pid)
                        await asyncio.sleep(args.idle_s)
                        attached = cpu_seconds(ledger_pid) - before
                        console_idle = cpu_seconds(console.pid) - console_before
                    print(
                        f"idle {args.idle_s:.0f} s: ledger CPU alone {alone * 1000:.0f} ms, with the console attached "
                        f"(4 watches, 1 open page) {attached * 1000:.0f} ms; console CPU {console_idle * 1000:.0f} ms"
                    )
            finally:
                console.terminate()
                console.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
