"""Controller benchmark (local runner): warm launcher vs fresh interpreter for the unmodified math agent.

Starts the real ledger (in memory), the stand-in engine, the real proxy and a real controller
(--max-concurrency 32) and runs examples/math_agent/agent.py:MathAgent, unchanged, end to end: queued ->
model call through the proxy -> reward posted -> succeeded. For each launch mode (the rollout label
agl-launch=warm|fresh, in the same controller and the same run):

  paced:  rollouts created one at a time, well under capacity: claim -> agent code running, from the
          controller's agl_controller_agent_start_seconds histogram (p50/p90 interpolated in its buckets).
  burst:  N rollouts enqueued at once: rollouts/s from the first create to the last end (ledger clock),
          each counted only if it succeeded with a reward event; claim -> running under that load; CPU per
          rollout of each process (from /proc: controller, launcher, agents, ledger, proxy, engine).
Last, a burst of a trivial agent class (prints one line) through the warm launcher: the launcher's capacity
when the agent itself costs next to nothing.

    .venv/bin/python bench/controller_bench.py [--warm N] [--fresh N] [--paced N]
    .venv/bin/python bench/controller_bench.py --agent calc [--calc N] [--rounds R]
    .venv/bin/python bench/controller_bench.py --agent true      # the old trivial-command pick-up bench

`--agent calc`: the unmodified calc agent (examples/calc_agent, a tool call and an answer per rollout on the
stand-in) in bursts through the warm launcher, under controllers started with the defaults,
--no-launcher-warm-clients and --agent-ca inherit, alternated round by round on one ledger, proxy and stand-in:
what the launcher's client warm-up (client_warmup.py) and the agents' CA directory (agent_ca.py) earn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import model_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready  # noqa: E402

TERMINAL = (rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED)
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
KEY = "bench-key"
MODEL = "bench-policy"
MATH_AGENT = "examples.math_agent.agent:MathAgent"
CALC_AGENT = "examples.calc_agent.agent:CalcAgent"
TRIVIAL_AGENT = "tests.controller.agents.simple:SyncAgent"
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
TICK = os.sysconf("SC_CLK_TCK")


# -- rollouts ----------------------------------------------------------------------------------------------------


def math_spec(mode: str, phase: str, i: int, agent_class: str = MATH_AGENT) -> rollout_pb2.RolloutSpec:
    config = rollout_pb2.RolloutConfig(timeout_seconds=120)
    config.local.agent_class = agent_class
    if agent_class == MATH_AGENT:
        config.local.env_map.update(TASK_ENV)
    a, b = i % 17, (i * 7) % 23
    return rollout_pb2.RolloutSpec(
        rollout_id=f"bench-{phase}-{uuid.uuid4().hex[:12]}",
        input_json=json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}),
        is_train=True,
        config=config,
        metadata=rollout_pb2.RolloutMetadata(labels={"phase": phase, "agl-launch": mode}),
    )


def command_spec(command: list[str], label: str) -> rollout_pb2.RolloutSpec:
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


async def wait_done(client: LedgerClient, label: str, count: int, timeout_s: float = 600) -> list[rollout_pb2.Rollout]:
    deadline = time.monotonic() + timeout_s
    while True:
        done = await client.list_rollouts(states=TERMINAL, labels={"phase": label})
        if len(done) >= count:
            return done
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: only {len(done)}/{count} finished")
        await asyncio.sleep(0.1)


async def rewarded(client: LedgerClient, rollouts: list[rollout_pb2.Rollout]) -> int:
    """How many succeeded with a reward event in their attempt."""
    count = 0
    for rollout in rollouts:
        if rollout.status.state != SUCCEEDED:
            continue
        events = await client.list_events(rollout.rollout_id, attempt_id=rollout.status.attempt_id)
        count += any(e.WhichOneof("payload") == "reward" for e in events)
    return count


# -- measurements from the processes ------------------------------------------------------------------------------


def cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of its reaped children) of a process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / TICK
    children = (int(fields[13]) + int(fields[14])) / TICK
    return own, children


def launcher_pids(controller_pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{controller_pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # a thread that just ended
            continue
        for pid in children:
            try:
                if b"fork_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


@dataclass
class Pids:
    controller: int
    ledger: int
    proxy: int
    engine: int


def snapshot(pids: Pids) -> dict[str, float]:
    ctl_own, ctl_children = cpu(pids.controller)
    launchers = [cpu(pid) for pid in launcher_pids(pids.controller)]
    return {
        "controller": ctl_own,
        "launcher": sum(own for own, _ in launchers),
        # Fresh interpreters are the controller's reaped children, warm ones the launcher's.
        "agents": ctl_children + sum(children for _, children in launchers),
        "ledger": cpu(pids.ledger)[0],
        "proxy": cpu(pids.proxy)[0],
        "engine": cpu(pids.engine)[0],
    }


_BUCKET = re.compile(r"^agl_controller_agent_start_seconds_bucket\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def start_buckets(metrics_url: str, mode: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) of the claim -> running histogram for one launch mode."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    buckets = []
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match and f'mode="{mode}"' in match["labels"]:
            le = re.search(r'le="([^"]+)"', match["labels"])[1]  # type: ignore[index]
            buckets.append((float(le), float(match["value"])))
    return sorted(buckets)


def histogram_quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float:
    """The q-quantile of the observations between two scrapes, linear within a bucket (as PromQL does)."""
    counts = dict(after)
    for le, count in before:
        counts[le] -= count
    ordered = sorted(counts.items())
    total = ordered[-1][1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, cumulative in ordered:
        if cumulative >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = le, cumulative
    return lower


# -- the math-agent bench ------------------------------------------------------------------------------------------


async def paced(client: LedgerClient, metrics_url: str, mode: str, count: int, rate: float) -> None:
    before = start_buckets(metrics_url, mode)
    for i in range(count):
        await client.create_rollouts([math_spec(mode, f"paced-{mode}", i)])
        await asyncio.sleep(1.0 / rate)
    done = await wait_done(client, f"paced-{mode}", count)
    after = start_buckets(metrics_url, mode)
    ok = await rewarded(client, done)
    p50, p90 = histogram_quantile(before, after, 0.5), histogram_quantile(before, after, 0.9)
    print(
        f"  paced ({count} created one by one at {rate:g}/s): claim -> agent running p50 {p50 * 1000:.1f} ms, "
        f"p90 {p90 * 1000:.1f} ms   succeeded with reward {ok}/{count}"
    )


async def burst(
    client: LedgerClient,
    metrics_url: str,
    pids: Pids,
    mode: str,
    count: int,
    concurrency: int,
    agent_class: str = MATH_AGENT,
) -> None:
    phase = f"burst-{mode}-{'math' if agent_class == MATH_AGENT else 'trivial'}"
    specs = [math_spec(mode, phase, i, agent_class) for i in range(count)]
    before, cpu_before = start_buckets(metrics_url, mode), snapshot(pids)
    for i in range(0, count, 100):
        await client.create_rollouts(specs[i : i + 100])
    done = await wait_done(client, phase, count)
    cpu_after, after = snapshot(pids), start_buckets(metrics_url, mode)
    ok = await rewarded(client, done) if agent_class == MATH_AGENT else sum(r.status.state == SUCCEEDED for r in done)
    first_create = min(seconds(r.status.create_time) for r in done)
    last_end = max(seconds(r.status.end_time) for r in done)
    span = last_end - first_create
    used = {name: (cpu_after[name] - cpu_before[name]) * 1000 / count for name in cpu_before}
    p50, p90 = histogram_quantile(before, after, 0.5), histogram_quantile(before, after, 0.9)
    print(f"  burst ({count} enqueued at once, concurrency {concurrency}):")
    print(
        f"    {ok / span:.1f} rollouts/s succeeded{' with reward' if agent_class == MATH_AGENT else ''} "
        f"({ok}/{count} in {span:.2f} s, ledger clock); "
        f"claim -> agent running p50 {p50 * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms"
    )
    launch = used["controller"] + used["launcher"]
    print(
        f"    CPU per rollout: controller {used['controller']:.1f} ms + launcher {used['launcher']:.1f} ms "
        f"= {launch:.1f} ms; agent processes {used['agents']:.1f} ms; ledger {used['ledger']:.1f} ms, "
        f"proxy {used['proxy']:.1f} ms, engine {used['engine']:.1f} ms; all {sum(used.values()):.1f} ms"
    )


async def math_bench(ledger: str, metrics_url: str, pids: Pids, args: argparse.Namespace) -> None:
    async with LedgerClient(ledger, KEY) as client:
        # Warm-up: the launcher imports the agent once; the first fresh agents fill the page cache.
        for mode in ("warm", "fresh"):
            await client.create_rollouts([math_spec(mode, f"warmup-{mode}", i) for i in range(4)])
            await wait_done(client, f"warmup-{mode}", 4)
        for mode, count in (("warm", args.warm), ("fresh", args.fresh)):
            if count <= 0:
                continue
            print(f"{mode}:")
            if args.paced <= 0:
                pass
            elif mode == "warm":
                await paced(client, metrics_url, mode, args.paced, args.rate)
            else:  # a fresh interpreter takes about a second of CPU: pace them well under that
                await paced(client, metrics_url, mode, max(args.paced // 4, 4), args.fresh_rate)
            await burst(client, metrics_url, pids, mode, count, args.concurrency)
        if args.trivial > 0:
            # The launcher's own capacity: an agent class that only prints, so the agent costs next to nothing.
            print(f"warm, trivial agent ({TRIVIAL_AGENT}):")
            await burst(client, metrics_url, pids, "warm", args.trivial, args.concurrency, TRIVIAL_AGENT)


@dataclass
class ModelStack:
    ledger: str
    proxy_url: str
    ledger_pid: int
    proxy_pid: int
    engine_pid: int


def start_model_stack(stack: ExitStack, tmp: Path) -> ModelStack:
    """Ledger, stand-in engine (registered as the model) and proxy."""
    ledger = stack.enter_context(start_ledger(key=KEY, log_dir=tmp))
    engine_port, proxy_port = free_port(), free_port()
    engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    engine_argv = [sys.executable, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(engine_port)]
    engine = stack.enter_context(
        start_service(
            [*engine_argv, "--model", MODEL, "--log-level", "warning"],
            name="standin",
            ready=lambda _: wait_http_ready(f"{engine_url}/health"),
            log_dir=tmp,
        )
    )

    async def register() -> None:
        async with LedgerClient(ledger.address, KEY) as client:
            endpoint = model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{engine_url}/v1", version=1)
            await client.register_models([endpoint])

    asyncio.run(register())
    proxy_argv = [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy_port)]
    proxy = stack.enter_context(
        start_service(
            [*proxy_argv, "--ledger", ledger.address, "--model-name", MODEL, "--log-level", "warning"],
            name="proxy",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"{proxy_url}/healthz"),
            log_dir=tmp,
        )
    )
    return ModelStack(ledger.address, proxy_url, ledger.proc.pid, proxy.proc.pid, engine.proc.pid)


def start_controller(
    stack: ExitStack, tmp: Path, models: ModelStack, concurrency: int, extra: tuple[str, ...] = ()
) -> tuple[str, Pids]:
    """A local-runner controller on the model stack; returns its metrics URL and the pids the CPU is read from."""
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    argv = [sys.executable, "-m", "services.controller", "--ledger", models.ledger, "--runner", "local"]
    argv += ["--proxy-url", models.proxy_url, "--max-concurrency", str(concurrency), "--log-dir", f"{tmp}/logs"]
    argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--log-level", "WARNING", *extra]
    controller = stack.enter_context(
        start_service(
            argv,
            name=f"controller-{uuid.uuid4().hex[:6]}",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(metrics_url),
            log_dir=tmp,
        )
    )
    return metrics_url, Pids(controller.proc.pid, models.ledger_pid, models.proxy_pid, models.engine_pid)


def start_math_stack(stack: ExitStack, tmp: Path, args: argparse.Namespace) -> tuple[str, str, Pids]:
    """Ledger, stand-in engine (registered as the model), proxy and controller; returns addresses and pids."""
    models = start_model_stack(stack, tmp)
    metrics_url, pids = start_controller(stack, tmp, models, args.concurrency)
    return models.ledger, metrics_url, pids


# -- the calc-agent bench: what the launcher's client warm-up and the agents' CA directory earn ------------------

# Controller settings compared, each against the defaults, in alternated rounds on one model stack.
CALC_VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "--no-launcher-warm-clients": ("--no-launcher-warm-clients",),
    "--agent-ca inherit": ("--agent-ca", "inherit"),
    "--agent-sandbox off": ("--agent-sandbox", "off"),
}


def calc_spec(phase: str, i: int) -> rollout_pb2.RolloutSpec:
    config = rollout_pb2.RolloutConfig(timeout_seconds=120)
    config.local.agent_class = CALC_AGENT
    config.local.env_map.update(TASK_ENV)
    a, b = 100 + i % 170, 3 + (i * 7) % 23
    return rollout_pb2.RolloutSpec(
        rollout_id=f"bench-{phase}-{uuid.uuid4().hex[:12]}",
        input_json=json.dumps({"question": f"What is {a} * {b}?", "answer": str(a * b)}),
        is_train=True,
        config=config,
        metadata=rollout_pb2.RolloutMetadata(labels={"phase": phase}),
    )


async def calc_burst(ledger: str, pids: Pids, phase: str, count: int) -> tuple[float, dict[str, float], float]:
    """(rollouts/s succeeded with a reward, CPU ms per rollout by process, model calls per rollout) of one burst."""
    async with LedgerClient(ledger, KEY) as client:
        before = snapshot(pids)
        specs = [calc_spec(phase, i) for i in range(count)]
        for i in range(0, count, 100):
            await client.create_rollouts(specs[i : i + 100])
        done = await wait_done(client, phase, count)
        after = snapshot(pids)
        ok = await rewarded(client, done)
        span = max(seconds(r.status.end_time) for r in done) - min(seconds(r.status.create_time) for r in done)
        sample = done[:10]
        calls = 0
        for rollout in sample:
            events = await client.list_events(rollout.rollout_id, attempt_id=rollout.status.attempt_id)
            calls += sum(e.WhichOneof("payload") == "model_request" for e in events)
    return ok / span, {name: (after[name] - before[name]) * 1000 / count for name in after}, calls / len(sample)


def run_calc_bench(args: argparse.Namespace, tmp: Path) -> None:
    results: dict[str, list[tuple[float, dict[str, float], float]]] = {name: [] for name in CALC_VARIANTS}
    with ExitStack() as stack:
        models = start_model_stack(stack, tmp)
        print(f"{os.cpu_count()} CPUs; calc agent ({CALC_AGENT}) bursts of {args.calc}, concurrency {args.concurrency}")
        print("CPU ms a rollout: the agents (their inits included), the launcher, the controller")
        for round_ in range(args.rounds):
            for name, extra in CALC_VARIANTS.items():
                with ExitStack() as each:  # a new controller per variant and round: a new launcher
                    _, pids = start_controller(each, tmp, models, args.concurrency, extra)
                    asyncio.run(calc_burst(models.ledger, pids, f"warmup-{uuid.uuid4().hex[:8]}", 8))
                    phase = f"calc-{round_}-{uuid.uuid4().hex[:6]}"
                    rate, cpu_ms, calls = asyncio.run(calc_burst(models.ledger, pids, phase, args.calc))
                results[name].append((rate, cpu_ms, calls))
                print(f"  round {round_ + 1} {name:28s} {rate:6.1f} rollouts/s  agents {cpu_ms['agents']:5.1f}  "
                      f"launcher {cpu_ms['launcher']:4.1f}  controller {cpu_ms['controller']:4.1f}  "
                      f"{calls:.1f} model calls/rollout", flush=True)  # fmt: skip
    base = statistics.median(rate for rate, _, _ in results["defaults"])
    print(f"medians over {args.rounds} rounds:")
    for name, rows in results.items():
        rate = statistics.median(r for r, _, _ in rows)
        agents, launcher = (statistics.median(c[key] for _, c, _ in rows) for key in ("agents", "launcher"))
        print(f"  {name:28s} {rate:6.1f} rollouts/s ({rate / base:.2f}x the defaults)  CPU ms: agents {agents:5.1f}  "
              f"launcher {launcher:4.1f}")  # fmt: skip


# -- the trivial-command bench (pick-up latency and throughput of the controller alone) -----------------------------


async def command_bench(address: str, command: list[str], pickup: int, rate: float, burst_n: int) -> None:
    async with LedgerClient(address, KEY) as client:
        await client.create_rollouts([command_spec(command, "warmup") for _ in range(10)])
        await wait_done(client, "warmup", 10)
        for _ in range(pickup):
            await client.create_rollouts([command_spec(command, "pickup")])
            await asyncio.sleep(1.0 / rate)
        done = await wait_done(client, "pickup", pickup)
        latencies = [seconds(r.status.start_time) - seconds(r.status.create_time) for r in done]
        print(f"pick-up ({pickup} rollouts created one by one at {rate:g}/s), enqueue -> running:")
        print(
            f"  p50 {percentile(latencies, 0.5) * 1000:.1f} ms   p90 {percentile(latencies, 0.9) * 1000:.1f} ms   "
            f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms   mean {statistics.mean(latencies) * 1000:.1f} ms"
        )
        specs = [command_spec(command, "burst") for _ in range(burst_n)]
        for i in range(0, burst_n, 100):
            await client.create_rollouts(specs[i : i + 100])
        done = await wait_done(client, "burst", burst_n)
        span = max(seconds(r.status.end_time) for r in done) - min(seconds(r.status.create_time) for r in done)
        failed = sum(r.status.state != SUCCEEDED for r in done)
        print(f"throughput ({burst_n} enqueued at once): {burst_n / span:.1f} rollouts/s completed, failed {failed}")


def run_command_bench(args: argparse.Namespace, tmp: Path) -> None:
    command = ["true"] if args.agent == "true" else [sys.executable, "-c", "pass"]
    with start_ledger(key=KEY, log_dir=tmp) as ledger:
        metrics_port = free_port()
        argv = [sys.executable, "-m", "services.controller", "--ledger", ledger.address, "--runner", "local"]
        argv += ["--proxy-url", "http://127.0.0.1:9", "--max-concurrency", "32", "--log-dir", f"{tmp}/logs"]
        argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--log-level", "WARNING"]
        with start_service(
            argv,
            name="controller",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{metrics_port}/metrics"),
            log_dir=tmp,
        ):
            print(f"agent: {' '.join(command)}")
            asyncio.run(command_bench(ledger.address, command, args.paced, args.rate, args.burst))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=("math", "calc", "true", "python"), default="math")
    parser.add_argument("--warm", type=int, default=200, help="math: burst size of warm launches")
    parser.add_argument("--fresh", type=int, default=40, help="math: burst size of fresh interpreters")
    parser.add_argument("--paced", type=int, default=40, help="rollouts created one at a time per mode")
    parser.add_argument("--rate", type=float, default=5.0, help="creation rate of the paced phase, per second")
    parser.add_argument("--fresh-rate", type=float, default=0.5, help="creation rate of the fresh paced phase")
    parser.add_argument("--trivial", type=int, default=300, help="math: burst of a trivial warm agent class")
    parser.add_argument("--burst", type=int, default=1000, help="true/python: burst size")
    parser.add_argument("--calc", type=int, default=200, help="calc: burst size per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="calc: alternated rounds of the variants")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agl-controller-bench-") as tmp:
        if args.agent == "calc":
            run_calc_bench(args, Path(tmp))
            return
        if args.agent != "math":
            run_command_bench(args, Path(tmp))
            return
        with ExitStack() as stack:
            ledger, metrics_url, pids = start_math_stack(stack, Path(tmp), args)
            print(f"{os.cpu_count()} CPUs; ledger, proxy, engine, controller and agents share them")
            asyncio.run(math_bench(ledger, metrics_url, pids, args))


if __name__ == "__main__":
    main()
