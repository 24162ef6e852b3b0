"""What serving the Anthropic Messages and OpenAI Responses APIs by translation costs the proxy, next to chat.

Starts a real ledger, a stand-in engine (--delay-ms 20) and a proxy on loopback, then runs the same question as
chat completions, Messages and Responses calls (plain and streamed) at --clients concurrent clients and prints,
per API: throughput, p50/p99 latency, and the proxy's CPU per call (from /proc) with its ratio to the engine's
(the yardstick on a machine whose speed drifts). The engine does the same chat work for all three, so the
differences in proxy CPU are the translation (request in, answer or stream events out).

    .venv/bin/python bench/agent_api_bench.py [--calls 1500] [--clients 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import (
    KEY,
    MODEL,
    cpu_seconds,
    create_rollouts,
    free_port,
    load,
    start_ledger,
    start_service,
    wait_http_ready,
)

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient

QUESTION = "What is 17 + 25?"
BODIES = {
    "chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32},
    "messages": {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32},
    "responses": {"model": MODEL, "input": QUESTION, "max_output_tokens": 32},
}


async def bench(args: argparse.Namespace) -> None:
    standin_port, proxy_port = free_port(), free_port()
    python = sys.executable
    standin_argv = [python, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(standin_port)]
    standin_argv += ["--model", MODEL, "--delay-ms", str(args.delay_ms)]
    with (
        start_ledger(key=KEY) as ledger,
        start_service(
            standin_argv, name="standin", ready=lambda _: wait_http_ready(f"http://127.0.0.1:{standin_port}/health")
        ) as standin,
    ):
        async with LedgerClient(ledger.address, KEY) as client:
            endpoint = f"http://127.0.0.1:{standin_port}/v1"
            await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=endpoint, version=1)])
        proxy_argv = [python, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy_port)]
        proxy_argv += ["--ledger", ledger.address, "--model-name", MODEL, "--log-level", "warning"]
        with start_service(
            proxy_argv,
            name="proxy",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{proxy_port}/healthz"),
        ) as proxy:
            rollouts = await create_rollouts(ledger.address, args.clients)
            prefixes = [f"/proxy/rollout/{r}/attempt/at-1/mode/train/openai/v1" for r in rollouts]
            for api, body in BODIES.items():  # warm-up
                await load(proxy_port, [f"{p}/{api}" for p in prefixes], body, args.clients, 2 * args.clients)
            print(f"{args.clients} clients, {args.calls} calls per row, engine delay {args.delay_ms:g} ms")
            for round_number in range(1, args.rounds + 1):
                for stream in (False, True):
                    for api, body in BODIES.items():
                        paths = [f"{p}/{api}" for p in prefixes]
                        before = {n: cpu_seconds(p.proc.pid) for n, p in (("proxy", proxy), ("engine", standin))}
                        run = await load(proxy_port, paths, {**body, "stream": stream}, args.clients, args.calls)
                        used = {
                            n: cpu_seconds(p.proc.pid) - before[n] for n, p in (("proxy", proxy), ("engine", standin))
                        }
                        name = f"round {round_number} {api}{' stream' if stream else ''}"
                        print(
                            f"{name:<34} {run.rate:6.0f}/s  p50 {run.pct(0.5):6.2f} ms  p99 {run.pct(0.99):7.2f} ms  "
                            f"proxy CPU {used['proxy'] / args.calls * 1000:.3f} ms/call "
                            f"(proxy/engine {used['proxy'] / max(used['engine'], 1e-9):.2f})"
                            + (f"  errors {run.errors}" if run.errors else "")
                        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
