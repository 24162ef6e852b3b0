"""Ledger benchmark: append throughput, creates/s, terminal-notification latency, CPU and memory per event.

Run: .venv/bin/python bench/ledger_bench.py [--stores memory,sqlite] [--quick]

Each figure comes from a real ledger subprocess on loopback. Clients run in separate processes (so the client
side does not share the ledger's interpreter); server CPU is read from /proc/<pid>/stat of the ledger, memory
from /proc/<pid>/status (VmRSS). "single via LedgerClient": 32 concurrent callers in one process share one
LedgerClient, which merges the calls that arrive while a request is in flight into the next request and sends the
requests over one StreamAppendEvents call; "... x2 procs": the same 32 callers split over two processes (say, two
proxy replicas), each with its own LedgerClient.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services._gen.agl.v1 import event_pb2, rollout_pb2  # noqa: E402
from services._gen.agl.v1 import ledger_service_pb2 as pb  # noqa: E402
from services._gen.agl.v1 import ledger_service_pb2_grpc as pb_grpc  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ledger:
    def __init__(self, store: str, workdir: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(workdir / f"ledger-{self.port}.log", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "services.ledger", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--store", store, "--metrics-port", "0", "--log-level", "WARNING"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.LedgerServiceStub(channel)
            while True:
                try:
                    stub.GetProxyControl(pb.GetProxyControlRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError("ledger did not start") from None
                    time.sleep(0.1)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def model_request_event(rollout_id: str, n: int) -> event_pb2.Event:
    """A ~3 KB model_request: 300 prompt tokens, 100 response tokens with log-probs, request/response JSON."""
    event = event_pb2.Event(rollout_id=rollout_id, event_type="model_request", event_id=f"{rollout_id}-{n}")
    mr = event.model_request
    mr.request_json = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 700}]})
    mr.response_json = json.dumps({"choices": [{"message": {"role": "assistant", "content": "y" * 500}}]})
    mr.prompt_token_ids.extend(range(1000, 1300))
    mr.response_token_ids.extend(range(2000, 2100))
    mr.response_logprobs.extend([-0.25] * 100)
    mr.has_response_logprobs = True
    mr.model, mr.model_version, mr.http_status = "m", 1, 200
    mr.status = event_pb2.MODEL_REQUEST_STATUS_OK
    return event


# -- client worker processes -----------------------------------------------------------------------------------------


async def _append_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    latencies: list[float] = []
    channels = [grpc.aio.insecure_channel(address) for _ in range(2)]
    stubs = [pb_grpc.LedgerServiceStub(c) for c in channels]

    async def client(i: int, rollout_id: str) -> None:
        stub = stubs[i % len(stubs)]
        template = model_request_event(rollout_id, 0)
        for n in range(per_client // batch):
            events = []
            for k in range(batch):
                event = event_pb2.Event()
                event.CopyFrom(template)
                event.event_id = f"{rollout_id}-{n}-{k}"
                events.append(event)
            request = pb.AppendEventsRequest(events=events)
            started = time.perf_counter()
            await stub.AppendEvents(request)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(i, rid) for i, rid in enumerate(rollout_ids)))
    elapsed = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return {"elapsed": elapsed, "calls": len(latencies), "max_latency": max(latencies), "latencies": latencies}


def append_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    return asyncio.run(_append_worker(address, rollout_ids, per_client, batch))


async def _stream_append_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    """Like _append_worker over StreamAppendEvents: one stream per client, each append awaited before the next."""
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LedgerServiceStub(channel)

        async def client(rollout_id: str) -> None:
            call = stub.StreamAppendEvents()
            event = model_request_event(rollout_id, 0)
            for n in range(per_client):
                event.event_id = f"{rollout_id}-s{n}"
                started = time.perf_counter()
                await call.write(
                    pb.StreamAppendEventsRequest(request_id=n, append=pb.AppendEventsRequest(events=[event]))
                )
                reply = await call.read()
                latencies.append(time.perf_counter() - started)
                assert reply.request_id == n and not reply.error_code, reply.error_message
            await call.done_writing()

        started = time.perf_counter()
        await asyncio.gather(*(client(rid) for rid in rollout_ids))
        elapsed = time.perf_counter() - started
    return {"elapsed": elapsed, "calls": len(latencies), "max_latency": max(latencies), "latencies": latencies}


def stream_append_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    return asyncio.run(_stream_append_worker(address, rollout_ids, per_client, batch))


async def _coalesced_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    """Single appends through one shared LedgerClient, which merges concurrent calls into shared requests."""
    from services.client import LedgerClient

    latencies: list[float] = []
    async with LedgerClient(address) as ledger_client:

        async def client(rollout_id: str) -> None:
            event = model_request_event(rollout_id, 0)
            for n in range(per_client):
                event.event_id = f"{rollout_id}-c{n}"
                started = time.perf_counter()
                await ledger_client.append_events([event])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client(rid) for rid in rollout_ids))
        elapsed = time.perf_counter() - started
        requests = ledger_client.append_requests
    return {"elapsed": elapsed, "calls": len(latencies), "max_latency": max(latencies), "latencies": latencies,
            "requests": requests}  # fmt: skip


def coalesced_worker(address: str, rollout_ids: list[str], per_client: int, batch: int) -> dict[str, object]:
    return asyncio.run(_coalesced_worker(address, rollout_ids, per_client, batch))


async def _create_worker(address: str, prefix: str, clients: int, per_client: int, batch: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LedgerServiceStub(channel)

        async def client(c: int) -> None:
            for n in range(per_client // batch):
                specs = [
                    rollout_pb2.RolloutSpec(
                        rollout_id=f"{prefix}-{c}-{n}-{k}",
                        input_json='{"question": "What is 2 + 2?", "answer": 4}',
                        metadata=rollout_pb2.RolloutMetadata(labels={"run": prefix, "group": str(n)}),
                    )
                    for k in range(batch)
                ]
                await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=specs))

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return time.perf_counter() - started


def create_worker(address: str, prefix: str, clients: int, per_client: int, batch: int) -> float:
    return asyncio.run(_create_worker(address, prefix, clients, per_client, batch))


# -- measurements ----------------------------------------------------------------------------------------------------


def run_parallel(pool: concurrent.futures.Executor, fn, jobs: list[tuple]) -> list:
    return [f.result() for f in [pool.submit(fn, *job) for job in jobs]]


def create_rollouts(address: str, ids: list[str]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.LedgerServiceStub(channel)
        for i in range(0, len(ids), 500):
            specs = [rollout_pb2.RolloutSpec(rollout_id=r) for r in ids[i : i + 500]]
            stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=specs))


def appends(
    ledger: Ledger, pool, procs: int, clients: int, total: int, batch: int, tag: str, worker=append_worker
) -> dict[str, float]:
    ids = [f"{tag}-{c}" for c in range(clients)]
    create_rollouts(ledger.address, ids)
    per_proc = clients // procs
    per_client = total // clients
    cpu0 = ledger.cpu_seconds()
    started = time.perf_counter()
    results = run_parallel(
        pool,
        worker,
        [(ledger.address, ids[p * per_proc : (p + 1) * per_proc], per_client, batch) for p in range(procs)],
    )
    wall = time.perf_counter() - started
    cpu = ledger.cpu_seconds() - cpu0
    events = per_client * clients // batch * batch
    latencies = sorted(x for r in results for x in r["latencies"])
    requests = sum(r.get("requests", len(r["latencies"])) for r in results)
    return {
        "events_per_s": events / max(r["elapsed"] for r in results),
        "events_per_request": events / requests,
        "wall_s": wall,
        "server_cpu_ms_per_event": cpu / events * 1000,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "max_ms": latencies[-1] * 1000,
    }


def creates(ledger: Ledger, pool, procs: int, clients: int, total: int, batch: int, tag: str) -> float:
    per_client = total // (procs * clients)
    elapsed = run_parallel(
        pool, create_worker, [(ledger.address, f"{tag}{p}", clients, per_client, batch) for p in range(procs)]
    )
    return per_client * clients * procs / max(elapsed)


async def _notification_latency(address: str, n: int, tag: str) -> list[float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LedgerServiceStub(channel)
        ids = [f"{tag}-{i}" for i in range(n)]
        await stub.CreateRollouts(
            pb.CreateRolloutsRequest(rollouts=[rollout_pb2.RolloutSpec(rollout_id=r) for r in ids])
        )
        for rid in ids:
            await stub.UpdateRolloutStatus(pb.UpdateRolloutStatusRequest(rollout_id=rid, state=2, attempt_id="a"))
        sent: dict[str, float] = {}
        arrived: dict[str, float] = {}
        # Start the feed at the end of the terminal log, so only the completions below are timed.
        page = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(after_cursor=0, page_size=1000))
        cursor = page.next_cursor
        while page.entries:
            page = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(after_cursor=cursor, page_size=1000))
            cursor = page.next_cursor
        watch = stub.WatchTerminalRollouts(pb.WatchTerminalRolloutsRequest(after_cursor=cursor, include_events=True))

        async def consume() -> None:
            while len(arrived) < n:
                message = await watch.read()
                arrived[message.entry.rollout.rollout_id] = time.perf_counter()

        consumer = asyncio.create_task(consume())
        for rid in ids:
            sent[rid] = time.perf_counter()
            await stub.UpdateRolloutStatus(pb.UpdateRolloutStatusRequest(rollout_id=rid, state=3))
            await asyncio.sleep(0.002)
        await asyncio.wait_for(consumer, 60)
        watch.cancel()
        return sorted(arrived[r] - sent[r] for r in ids)


def notification_latency(address: str, n: int, tag: str) -> dict[str, float]:
    lat = asyncio.run(_notification_latency(address, n, tag))
    return {"p50_ms": lat[len(lat) // 2] * 1000, "p99_ms": lat[int(len(lat) * 0.99)] * 1000, "max_ms": lat[-1] * 1000}


async def _bulk_load(address: str, rollouts: int, per_rollout: int, tag: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LedgerServiceStub(channel)
        ids = [f"{tag}-{i}" for i in range(rollouts)]
        await stub.CreateRollouts(
            pb.CreateRolloutsRequest(rollouts=[rollout_pb2.RolloutSpec(rollout_id=r) for r in ids])
        )
        sem = asyncio.Semaphore(8)

        async def load(rid: str) -> None:
            for start in range(0, per_rollout, 100):
                async with sem:
                    events = [model_request_event(rid, start + k) for k in range(100)]
                    await stub.AppendEvents(pb.AppendEventsRequest(events=events))

        await asyncio.gather(*(load(r) for r in ids))


def transport_ceiling(ledger: Ledger, seconds: float = 3.0) -> float:
    """Calls/s of an RPC that does no work (GetProxyControl): what grpc.aio itself allows on this machine."""

    async def run() -> float:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            stub = pb_grpc.LedgerServiceStub(channel)
            count = 0
            deadline = time.perf_counter() + seconds

            async def client() -> None:
                nonlocal count
                while time.perf_counter() < deadline:
                    await stub.GetProxyControl(pb.GetProxyControlRequest())
                    count += 1

            started = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(32)))
            return count / (time.perf_counter() - started)

    return asyncio.run(run())


def bench_store(kind: str, quick: bool, pool, procs: int) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"agl-ledger-bench-{kind}-"))
    store = "memory" if kind == "memory" else f"sqlite:{workdir / 'ledger.db'}"
    scale = 0.25 if quick else 1.0
    out: dict[str, object] = {}
    ledger = Ledger(store, workdir)
    try:
        out["transport_ceiling_calls_per_s"] = transport_ceiling(ledger, 2.0 if quick else 3.0)
        appends(ledger, pool, procs, 32, 640, 1, "warmup")  # connections, code paths, allocator
        out["single_early"] = appends(ledger, pool, procs, 32, int(5120 * scale), 1, "early")
        out["stream_single"] = appends(
            ledger, pool, procs, 32, int(5120 * scale), 1, "stream", worker=stream_append_worker
        )
        out["coalesced_single"] = appends(
            ledger, pool, 1, 32, int(5120 * scale), 1, "coalesced", worker=coalesced_worker
        )  # one process: the 32 callers share one client
        out["coalesced_single_2procs"] = appends(
            ledger, pool, 2, 32, int(5120 * scale), 1, "coalesced2", worker=coalesced_worker
        )  # two processes of 16 callers, one client each
        out["batch32"] = appends(ledger, pool, procs, 32, int(32768 * scale), 32, "batch")
        out["creates_single_per_s"] = creates(ledger, pool, procs, 16, int(2048 * scale), 1, "cs")
        out["creates_batch100_per_s"] = creates(ledger, pool, procs, 4, int(24000 * scale), 100, "cb")
        out["terminal_notification"] = notification_latency(ledger.address, int(400 * scale), "term")
        rss0 = ledger.rss_bytes()
        stored = int(100_000 * scale)
        load_started = time.perf_counter()
        asyncio.run(_bulk_load(ledger.address, 100, stored // 100, "bulk"))
        out["bulk_load_events_per_s"] = stored / (time.perf_counter() - load_started)
        out["rss_kib_per_event"] = (ledger.rss_bytes() - rss0) / stored / 1024
        out["rss_mib_per_100k_events"] = (ledger.rss_bytes() - rss0) / stored * 100_000 / 2**20
        out["single_late"] = appends(ledger, pool, procs, 32, int(5120 * scale), 1, "late")
        out["coalesced_late"] = appends(
            ledger, pool, 1, 32, int(5120 * scale), 1, "coalesced-late", worker=coalesced_worker
        )
    finally:
        ledger.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _line(label: str, r: dict[str, float]) -> str:
    return (
        f"{label:<24}{r['events_per_s']:8.0f} events/s   server CPU {r['server_cpu_ms_per_event']:.3f} ms/event   "
        f"latency p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms max {r['max_ms']:.1f} ms"
    )


def report(kind: str, r: dict) -> None:
    t = r["terminal_notification"]
    early, late = r["single_early"], r["single_late"]
    print(f"\n== {kind} ==")
    print(f"{'no-op unary RPC':<24}{r['transport_ceiling_calls_per_s']:8.0f} calls/s (grpc.aio ceiling, 32 clients)")
    print(_line("single appends (unary)", early))
    print(_line("single appends (stream)", r["stream_single"]))
    coalesced = r["coalesced_single"]
    print(_line("single via LedgerClient", coalesced) + f"   {coalesced['events_per_request']:.1f} events/request")
    two = r["coalesced_single_2procs"]
    print(_line("  ... x2 procs", two) + f"   {two['events_per_request']:.1f} events/request")
    print(_line("batched appends (32)", r["batch32"]))
    print(
        f"{'rollouts created':<24}{r['creates_single_per_s']:8.0f} /s one per call, "
        f"{r['creates_batch100_per_s']:.0f} /s in batches of 100"
    )
    print(f"{'terminal notification':<24}p50 {t['p50_ms']:.2f} ms  p99 {t['p99_ms']:.2f} ms  max {t['max_ms']:.2f} ms")
    print(
        f"{'memory':<24}{r['rss_kib_per_event']:.2f} KiB RSS per stored ~3 KB event "
        f"({r['rss_mib_per_100k_events']:.0f} MiB per 100k; bulk load {r['bulk_load_events_per_s']:.0f} events/s)"
    )
    print(
        f"{'slowest single append':<24}{early['max_ms']:.1f} ms early (empty ledger) vs {late['max_ms']:.1f} ms late "
        f"(after the bulk load); p99 {early['p99_ms']:.1f} vs {late['p99_ms']:.1f} ms"
    )
    early, late = r["coalesced_single"], r["coalesced_late"]
    print(
        f"{'  ... via LedgerClient':<24}{early['max_ms']:.1f} ms early vs {late['max_ms']:.1f} ms late; "
        f"p99 {early['p99_ms']:.1f} vs {late['p99_ms']:.1f} ms"
    )
    print(json.dumps({kind: {k: v for k, v in r.items()}}, default=float))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stores", default="memory,sqlite")
    parser.add_argument("--quick", action="store_true", help="a quarter of the work (smoke run)")
    parser.add_argument("--client-procs", type=int, default=2)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    print(f"ledger bench: {os.cpu_count()} CPUs, 32 concurrent clients in {args.client_procs} processes, ~3 KB events")
    with concurrent.futures.ProcessPoolExecutor(args.client_procs, mp_context=ctx) as pool:
        for kind in args.stores.split(","):
            report(kind, bench_store(kind, args.quick, pool, args.client_procs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
