"""Proxy overhead: proxied vs direct calls to a stand-in engine that answers after a fixed delay.

Starts a real ledger, one stand-in engine (--delay-ms 20) and one proxy process on loopback, then measures:
added latency at 1 client (p50/p99), throughput and p50/p99 at 64 concurrent clients (plain and streamed calls),
the proxy's CPU per call (from /proc), and the streaming time-to-first-chunk overhead. The load generator is a
minimal keep-alive HTTP/1.1 client on asyncio streams, so that its own cost disturbs the 2-core machine as little
as possible.

    .venv/bin/python bench/proxy_bench.py [--calls 3000] [--clients 64] [--delay-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services._gen.agl.v1 import model_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready  # noqa: E402

KEY = "bench-key"
MODEL = "bench-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 32}


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a prebuilt request, read the whole response (or its first chunk)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    @staticmethod
    def request(host: str, path: str, body: bytes) -> bytes:
        head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        head += f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
        return head.encode() + body

    async def call(self, request: bytes, first_chunk: bool = False) -> tuple[int, float]:
        """Returns (status, seconds to the first body chunk when first_chunk, else to the end of the body)."""
        assert self.reader is not None and self.writer is not None
        started = time.perf_counter()
        self.writer.write(request)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length, chunked = None, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value:
                chunked = True
        first: float | None = None
        if length is not None:
            await self.reader.readexactly(length)
        elif chunked:
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if first is None:
                    first = time.perf_counter() - started
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        elapsed = time.perf_counter() - started
        return status, (first if first_chunk and first is not None else elapsed)


def proxy_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(("agl_proxy_engine_connections_opened", "agl_proxy_ledger_append_batches")):
            values[name] = float(value)
    return values


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    latencies: list[float]
    wall_s: float
    errors: int

    def pct(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(int(len(ordered) * p), len(ordered) - 1)] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s


async def load(port: int, paths: list[str], body: dict, clients: int, calls: int, first_chunk: bool = False) -> Run:
    payload = json.dumps(body).encode()
    requests = [Connection.request("127.0.0.1", path, payload) for path in paths]
    connections = [Connection("127.0.0.1", port) for _ in range(clients)]
    await asyncio.gather(*(c.open() for c in connections))
    latencies: list[float] = []
    errors = 0
    remaining = calls

    async def worker(index: int, connection: Connection) -> None:
        nonlocal remaining, errors
        request = requests[index % len(requests)]
        while remaining > 0:
            remaining -= 1
            status, seconds = await connection.call(request, first_chunk)
            if status != 200:
                errors += 1
            latencies.append(seconds)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(connections)))
    wall = time.perf_counter() - started
    for connection in connections:
        assert connection.writer is not None
        connection.writer.close()
    return Run(latencies, wall, errors)


async def create_rollouts(address: str, count: int) -> list[str]:
    async with LedgerClient(address, KEY) as client:
        ids = [f"bench-{i}-{time.time_ns()}" for i in range(count)]
        await client.create_rollouts(
            [rollout_pb2.RolloutSpec(rollout_id=i, input_json="{}", is_train=True) for i in ids]
        )
        for rollout_id in ids:
            await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
        return ids


def report(name: str, direct: Run, proxied: Run) -> None:
    print(
        f"{name:<34} direct p50 {direct.pct(0.5):7.2f} ms  p99 {direct.pct(0.99):7.2f} ms  {direct.rate:7.0f}/s | "
        f"proxied p50 {proxied.pct(0.5):7.2f} ms  p99 {proxied.pct(0.99):7.2f} ms  {proxied.rate:7.0f}/s | "
        f"added p50 {proxied.pct(0.5) - direct.pct(0.5):+6.2f} ms  p99 {proxied.pct(0.99) - direct.pct(0.99):+7.2f} ms"
        + (f"  errors {direct.errors}/{proxied.errors}" if direct.errors or proxied.errors else "")
    )


async def bench(args: argparse.Namespace) -> None:
    standin_port, proxy_port = free_port(), free_port()
    python = sys.executable
    with (
        start_ledger(key=KEY) as ledger,
        start_service(
            [
                python,
                "-m",
                "services.standin",
                "--host",
                "127.0.0.1",
                "--port",
                str(standin_port),
                "--model",
                MODEL,
                "--delay-ms",
                str(args.delay_ms),
            ],
            name="standin",
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{standin_port}/health"),
        ) as standin,
    ):
        async with LedgerClient(ledger.address, KEY) as client:
            endpoint = f"http://127.0.0.1:{standin_port}/v1"
            await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=endpoint, version=1)])
        with start_service(
            [
                python,
                "-m",
                "services.proxy",
                "--host",
                "127.0.0.1",
                "--port",
                str(proxy_port),
                "--ledger",
                ledger.address,
                "--model-name",
                MODEL,
                "--log-level",
                "warning",
            ],
            name="proxy",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{proxy_port}/healthz"),
        ) as proxy:
            rollouts = await create_rollouts(ledger.address, args.clients)
            proxied_paths = [f"/proxy/rollout/{r}/attempt/at-1/mode/train/openai/v1/chat/completions" for r in rollouts]
            direct_path = ["/v1/chat/completions"]
            # The direct calls carry what the proxy would add, so both sides do the same engine work.
            direct_body = {**CHAT, "temperature": 1.0, "return_token_ids": True, "logprobs": True}

            # Warm-up at full concurrency, so that no measured round pays for opening connections.
            await load(standin_port, direct_path, direct_body, args.clients, 4 * args.clients)
            await load(proxy_port, proxied_paths, CHAT, args.clients, 4 * args.clients)

            single = args.single
            report(
                "1 client",
                await load(standin_port, direct_path, direct_body, 1, single),
                await load(proxy_port, proxied_paths[:1], CHAT, 1, single),
            )

            processes = (("proxy", proxy), ("engine", standin), ("ledger", ledger))

            async def concurrent_round(name: str, direct_request: dict, proxied_request: dict) -> None:
                direct = await load(standin_port, direct_path, direct_request, args.clients, args.calls)
                counters = proxy_counters(proxy_port)
                cpu = {name: cpu_seconds(p.proc.pid) for name, p in processes}
                proxied = await load(proxy_port, proxied_paths, proxied_request, args.clients, args.calls)
                used = {name: cpu_seconds(p.proc.pid) - cpu[name] for name, p in processes}
                report(name, direct, proxied)
                after = proxy_counters(proxy_port)
                opened_name, batches_name = (
                    "agl_proxy_engine_connections_opened_total",
                    "agl_proxy_ledger_append_batches_total",
                )
                opened = after[opened_name] - counters[opened_name]
                batches = after[batches_name] - counters[batches_name]
                per_call = ", ".join(f"{name} {seconds / args.calls * 1000:.2f} ms" for name, seconds in used.items())
                # The engine's CPU per call is the yardstick: this machine's speed drifts between runs, the ratio
                # much less.
                ratio = used["proxy"] / max(used["engine"], 1e-9)
                print(
                    f"{'  CPU per proxied call':<34} {per_call} (proxy/engine {ratio:.2f}); "
                    f"{opened:.0f} new engine connections, {args.calls / max(batches, 1):.1f} events per ledger "
                    "append request"
                )

            # The machine is shared and noisy: several rounds, each a direct run then a proxied one.
            for round_number in range(1, args.rounds + 1):
                await concurrent_round(f"{args.clients} clients, round {round_number}", direct_body, CHAT)

            stream_body = {**CHAT, "stream": True}
            direct_stream = {**direct_body, "stream": True}
            await concurrent_round(f"{args.clients} clients, streamed", direct_stream, stream_body)
            report(
                "stream time-to-first-chunk, 1 cl.",
                await load(standin_port, direct_path, direct_stream, 1, single, True),
                await load(proxy_port, proxied_paths[:1], stream_body, 1, single, True),
            )
            report(
                "stream full call, 1 client",
                await load(standin_port, direct_path, direct_stream, 1, single),
                await load(proxy_port, proxied_paths[:1], stream_body, 1, single),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="calls per 64-client run")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--single", type=int, default=300, help="calls per 1-client run")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3, help="64-client rounds (direct, then proxied)")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
