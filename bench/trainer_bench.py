"""Trainer benchmark: finished trajectories delivered through the terminal stream, and adapter rows/s.

Starts the real ledger (in memory), fills it with finished rollouts of 10 model calls (~3 KB each) plus a
reward, then measures:
  stream:   one WatchTerminalRollouts consumer (include_events, triplet view) from cursor 0 -> trajectories/s
  manager:  the trainer's RolloutManager running a sync step over the same kind of rollouts, finished by a
            stand-in controller as they are queued (creation, trace building, state file, deletion) -> trajectories/s
  adapter:  traces -> verl DataProto (trajectory and transition levels) -> rows/s

The reference trainer fetched each finished rollout with two GETs: 775 rollouts/s at 16 concurrent clients.

    .venv/bin/python bench/trainer_bench.py [--rollouts 2000] [--adapter-rollouts 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import event_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from services.trainer.data.triplets import RolloutTrace, Triplet  # noqa: E402
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager  # noqa: E402
from services.trainer.rollouts.specs import LABEL_RUN, LaunchSettings, Sample, build_specs  # noqa: E402
from tests.support.procs import start_ledger  # noqa: E402

CALLS = 10
LAUNCH = LaunchSettings(timeout_seconds=60, agent_class="bench:Agent")


def call_events(rollout_id: str, rng: random.Random) -> list[event_pb2.Event]:
    """Ten calls of a growing conversation, ~3 KB each as stored (JSON bodies + tokens + log-probs)."""
    events = []
    context = [rng.randrange(1000, 150000) for _ in range(120)]
    for _ in range(CALLS):
        response = [rng.randrange(1000, 150000) for _ in range(40)]
        request = event_pb2.ModelRequest(
            request_json='{"messages":[{"role":"user","content":"' + "x" * 1500 + '"}]}',
            response_json='{"choices":[{"message":{"content":"' + "y" * 300 + '"}}]}',
            prompt_token_ids=context,
            response_token_ids=response,
            response_logprobs=[-rng.random() for _ in response],
            has_response_logprobs=True,
            model="bench",
            status=event_pb2.MODEL_REQUEST_STATUS_OK,
            http_status=200,
        )
        events.append(event_pb2.Event(rollout_id=rollout_id, event_type="model_request", model_request=request))
        context = context + response + [rng.randrange(1000, 150000) for _ in range(8)]
        context = context[-160:]  # keep each call near 3 KB
    events.append(event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=1.0)))
    return events


async def finish_all(client: LedgerClient, ids: list[str], rng: random.Random, concurrency: int = 16) -> int:
    """Runs every rollout to succeeded with its events; returns the bytes of one call event."""
    queue = list(ids)
    size = call_events("probe", rng)[0].ByteSize()

    async def worker() -> None:
        while queue:
            batch = [queue.pop() for _ in range(min(8, len(queue)))]
            for rid in batch:
                await client.update_status(rid, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="a1")
            events = [e for rid in batch for e in call_events(rid, rng)]
            await client.append_events(events)
            for rid in batch:
                await client.update_status(rid, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return size


async def create(client: LedgerClient, run_id: str, step: int, groups: int, n: int) -> list[str]:
    specs = []
    for slot in range(groups):
        specs += build_specs(run_id=run_id, step=step, slot=slot, sample=Sample(f"d{slot}", {}), n=n, launch=LAUNCH)
    for i in range(0, len(specs), 500):
        await client.create_rollouts(specs[i : i + 500])
    return [s.rollout_id for s in specs]


async def bench_stream(address: str, count: int) -> None:
    client = LedgerClient(address)
    rng = random.Random(1)
    ids = await create(client, "bench-stream", 1, count, 1)
    size = await finish_all(client, ids, rng)
    received = 0
    started = time.perf_counter()
    stream = client.watch_terminal(after_cursor=0, labels={LABEL_RUN: "bench-stream"}, include_events=True)
    async with contextlib.aclosing(stream) as entries:
        async for entry in entries:
            received += 1 if len(entry.events) == CALLS + 1 else 0
            if received == count:
                break
    seconds = time.perf_counter() - started
    print(f"stream:   {count} rollouts x {CALLS} calls (~{size} B per call event as stored)")
    rate = count / seconds
    print(f"          {rate:,.0f} trajectories/s through one WatchTerminalRollouts consumer ({seconds:.2f} s)")
    await client.close()


async def stand_in_controller(client: LedgerClient, run_id: str, count: int, rng: random.Random) -> None:
    """Finishes each rollout of the run as it is queued, as a controller whose agents answer at once would."""
    done: set[str] = set()
    while len(done) < count:
        queued = await client.list_rollouts(states=[rollout_pb2.ROLLOUT_STATE_QUEUING], labels={LABEL_RUN: run_id})
        fresh = [r.rollout_id for r in queued if r.rollout_id not in done]
        if not fresh:
            await asyncio.sleep(0.01)
            continue
        await finish_all(client, fresh, rng)
        done.update(fresh)


async def bench_manager(address: str, count: int, n: int = 4) -> None:
    """The manager creates its step's rollouts itself (it deletes finished ones with its ids first, as kept from
    an earlier pass), so a stand-in controller finishes them as they are queued; the figure is the whole step."""
    client = LedgerClient(address)
    rng = random.Random(2)
    groups = count // n
    with tempfile.TemporaryDirectory() as tmp:
        settings = ManagerSettings(
            run_id="bench-mgr", n=n, train_batch_size=groups, launch=LAUNCH, progress=False,
            state_path=Path(tmp) / "state.json",
        )  # fmt: skip
        manager = RolloutManager(client, settings)
        started = time.perf_counter()
        await manager.start()
        samples = iter([Sample(f"d{slot}", {}) for slot in range(groups)])
        controller = asyncio.create_task(stand_in_controller(client, "bench-mgr", groups * n, rng))
        result = await manager.collect(1, samples)
        seconds = time.perf_counter() - started
        await controller
        await manager.close()
    assert len(result.traces) == groups * n and all(len(t.triplets) == CALLS for t in result.traces)
    print(f"manager:  {groups * n:,} rollouts created, finished by a stand-in controller, collected as traces")
    print(f"          {groups * n / seconds:,.0f} trajectories/s ({seconds:.2f} s; state file and deletion included)")
    await client.close()


def bench_adapter(rollouts: int) -> None:
    from services.trainer.data.adapter import DataPathSettings, build_training_batch

    rng = random.Random(3)
    traces = []
    for r in range(rollouts):
        context = [rng.randrange(1000, 150000) for _ in range(120)]
        triplets = []
        for turn in range(CALLS):
            response = [rng.randrange(1000, 150000) for _ in range(40)]
            triplets.append(Triplet(list(context), response, [-0.5] * len(response), turn))
            context = context + response + [rng.randrange(1000, 150000) for _ in range(8)]
        traces.append(RolloutTrace(f"r{r}", f"g{r // 8}", f"d{r // 8}", float(r % 2), triplets))
    for level, prompt, response in (("transition", 1024, 64), ("trajectory", 256, 1024)):
        settings = DataPathSettings(level=level, max_prompt_length=prompt, max_response_length=response)
        build_training_batch(traces[:64], settings, counts=Counter())  # warm-up (first-touch allocations)
        best = float("inf")
        for _ in range(3):
            # A full collection first: otherwise when the collector's oldest generation runs, and over how many
            # objects, depends on what this process imported before (the same code measured 14k or 24k rows/s).
            gc.collect()
            started = time.perf_counter()
            out = build_training_batch(traces, settings, counts=Counter())
            best = min(best, time.perf_counter() - started)
        rows = len(out.data)
        print(f"adapter:  {level:<10} {rows:,} rows (P={prompt}, R={response}) best of 3 {best:.2f} s = "
              f"{rows / best:,.0f} rows/s, {rollouts / best:,.0f} rollouts/s")  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    with start_ledger(store="memory") as ledger:
        await bench_stream(ledger.address, args.rollouts)
        await bench_manager(ledger.address, args.rollouts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--adapter-rollouts", type=int, default=1024)
    args = parser.parse_args()
    asyncio.run(main_async(args))
    bench_adapter(args.adapter_rollouts)


if __name__ == "__main__":
    main()
