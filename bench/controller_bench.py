"""Controller benchmark (local runner): enqueue -> running latency and rollouts completed per second.

Starts the real ledger (in memory) and a real controller (--runner local --max-concurrency 32) and runs a
trivial agent that exits at once. Two phases:
  pick-up:    rollouts created one at a time (at a steady rate well under capacity); latency is the ledger's
              own create_time -> start_time (claimed, running) of each rollout, so no clock skew is involved.
  throughput: a burst of rollouts created at once; completed/s from the first create to the last end.

    .venv/bin/python bench/controller_bench.py [--agent true|python] [--pickup N] [--burst N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready  # noqa: E402

TERMINAL = (rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED)
KEY = "bench-key"


def make_spec(command: list[str], label: str) -> rollout_pb2.RolloutSpec:
    config = rollout_pb2.RolloutConfig(timeout_seconds=60)
    config.local.command.extend(command)
    return rollout_pb2.RolloutSpec(
        rollout_id=f"bench-{uuid.uuid4().hex[:12]}",
        input_json="{}",
        config=config,
        metadata=rollout_pb2.RolloutMetadata(labels={"phase": label}),
    )


def seconds(ts: object) -> float:
    return ts.ToNanoseconds() / 1e9  # type: ignore[attr-defined]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_done(client: LedgerClient, label: str, count: int, timeout_s: float = 120) -> list[rollout_pb2.Rollout]:
    deadline = time.monotonic() + timeout_s
    while True:
        done = await client.list_rollouts(states=TERMINAL, labels={"phase": label})
        if len(done) >= count:
            return done
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: only {len(done)}/{count} finished")
        await asyncio.sleep(0.1)


async def bench(address: str, command: list[str], pickup: int, rate: float, burst: int) -> None:
    async with LedgerClient(address, KEY) as client:
        # Warm-up: the first launches pay for imports and connection set-up.
        await client.create_rollouts([make_spec(command, "warmup") for _ in range(10)])
        await wait_done(client, "warmup", 10)

        for _ in range(pickup):
            await client.create_rollouts([make_spec(command, "pickup")])
            await asyncio.sleep(1.0 / rate)
        done = await wait_done(client, "pickup", pickup)
        latencies = [seconds(r.status.start_time) - seconds(r.status.create_time) for r in done]
        failed = sum(r.status.state != rollout_pb2.ROLLOUT_STATE_SUCCEEDED for r in done)
        print(f"pick-up ({pickup} rollouts created one by one at {rate:g}/s), enqueue -> running:")
        print(
            f"  p50 {percentile(latencies, 0.5) * 1000:.1f} ms   p90 {percentile(latencies, 0.9) * 1000:.1f} ms   "
            f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms   max {max(latencies) * 1000:.1f} ms   "
            f"mean {statistics.mean(latencies) * 1000:.1f} ms   failed {failed}"
        )

        specs = [make_spec(command, "burst") for _ in range(burst)]
        started = time.monotonic()
        for i in range(0, burst, 100):
            await client.create_rollouts(specs[i : i + 100])
        done = await wait_done(client, "burst", burst)
        wall = time.monotonic() - started
        first_create = min(seconds(r.status.create_time) for r in done)
        last_end = max(seconds(r.status.end_time) for r in done)
        latencies = [seconds(r.status.start_time) - seconds(r.status.create_time) for r in done]
        failed = sum(r.status.state != rollout_pb2.ROLLOUT_STATE_SUCCEEDED for r in done)
        print(f"throughput ({burst} rollouts enqueued at once, concurrency 32):")
        print(
            f"  {burst / (last_end - first_create):.1f} rollouts/s completed (ledger clock), "
            f"{burst / wall:.1f}/s wall incl. polling   failed {failed}"
        )
        print(
            f"  enqueue -> running under load: p50 {percentile(latencies, 0.5) * 1000:.0f} ms   "
            f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=("true", "python"), default="true")
    parser.add_argument("--pickup", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="pick-up phase creation rate per second")
    parser.add_argument("--burst", type=int, default=1000)
    args = parser.parse_args()
    command = ["true"] if args.agent == "true" else [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="agl-controller-bench-") as tmp, start_ledger(key=KEY) as ledger:
        metrics_port = free_port()
        argv = [sys.executable, "-m", "services.controller", "--ledger", ledger.address, "--runner", "local"]
        argv += ["--proxy-url", "http://127.0.0.1:9", "--max-concurrency", "32", "--log-dir", f"{tmp}/logs"]
        argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--log-level", "WARNING"]
        with start_service(
            argv,
            name="controller",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{metrics_port}/metrics"),
            log_dir=Path(tmp),
        ):
            print(f"agent: {' '.join(command)}   (2-core machine; ledger, controller and agents share it)")
            asyncio.run(bench(ledger.address, command, args.pickup, args.rate, args.burst))


if __name__ == "__main__":
    main()
