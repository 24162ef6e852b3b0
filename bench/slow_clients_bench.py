"""Slow clients against the proxy: does it keep serving while thousands of connections never finish their head?

Starts a real ledger, a stand-in engine and one proxy limited to 1,024 open files (prlimit), opens N connections
(default 2,000) that each send `GET /healthz HTTP/1.1\\r\\nHost: a\\r\\n` and then nothing, and meanwhile measures
how long a fresh /healthz and a real model call take. Then it waits for the proxy to close the slow connections
and reports how long that took (the header deadline, --header-timeout, is 10 s by default; 3 s here).

    .venv/bin/python bench/slow_clients_bench.py [--connections 2000] [--files 1024] [--header-timeout 3]

Target (issue 17): /healthz and a model call answer within 1 s, and every slow connection is closed within the
header deadline (plus the sweep interval).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services._gen.agl.v1 import model_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready  # noqa: E402

KEY = "bench-key"
MODEL = "bench-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 8}
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: a\r\n"


async def open_slow(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    pairs = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as err:
            print(f"  could not open slow connection {len(pairs) + 1}: {err}")
            break
        writer.write(SLOW_HEAD)
        pairs.append((reader, writer))
    return pairs


async def closed_after(reader: asyncio.StreamReader, started: float, limit: float) -> float | None:
    try:
        await asyncio.wait_for(reader.read(), limit)
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - started


async def timed(coro: object) -> tuple[int, float]:
    started = time.perf_counter()
    reply = await coro  # type: ignore[misc]
    return reply.status_code, time.perf_counter() - started


async def run(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    with start_ledger(key=KEY) as ledger:
        engine_port = free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        engine_argv = [sys.executable, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(engine_port)]
        engine_argv += ["--model", MODEL]
        with start_service(
            engine_argv, name="standin", port=engine_port, ready=lambda _: wait_http_ready(f"{engine_url}/health")
        ):
            async with LedgerClient(ledger.address, KEY) as client:
                await client.register_models(
                    [model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{engine_url}/v1", version=1)]
                )
                await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id="slow-bench", input_json="{}")])
                await client.update_status("slow-bench", rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="a1")
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = ["prlimit", f"--nofile={args.files}:{args.files}", sys.executable, "-m", "services.proxy"]
            argv += ["--host", "127.0.0.1", "--port", str(port), "--ledger", ledger.address, "--model-name", MODEL]
            argv += ["--header-timeout", str(args.header_timeout)]
            with start_service(
                argv, name="proxy", port=port, env={"AGL_KEY": KEY}, ready=lambda _: wait_http_ready(f"{url}/healthz")
            ) as proxy:
                chat_url = f"{url}/proxy/rollout/slow-bench/attempt/a1/mode/train/openai/v1/chat/completions"
                headers = {"authorization": f"Bearer {KEY}"}
                async with httpx.AsyncClient(timeout=30) as http:
                    print(f"proxy open-file limit {args.files}; opening {args.connections} slow connections")
                    started = time.monotonic()
                    slow = await open_slow(port, args.connections)
                    opened = time.monotonic() - started
                    print(f"  {len(slow)} opened in {opened:.2f}s")
                    for name in ("healthz", "model call"):
                        async with httpx.AsyncClient(timeout=30) as fresh:  # a new connection, as an agent's
                            request = (
                                fresh.get(f"{url}/healthz")
                                if name == "healthz"
                                else fresh.post(chat_url, json=CHAT, headers=headers)
                            )
                            status, seconds = await timed(request)
                        print(f"  {name} during the flood: HTTP {status} in {seconds * 1000:.0f} ms")
                    limit = args.header_timeout + 5
                    closes = await asyncio.gather(*(closed_after(r, started, limit) for r, _ in slow))
                    open_still = sum(c is None for c in closes)
                    done = sorted(c for c in closes if c is not None)
                    if done:
                        print(
                            f"  slow connections closed: {len(done)} (last {done[-1]:.2f}s after the flood began), "
                            f"still open after {limit:.0f}s: {open_still}"
                        )
                    for _, writer in slow:
                        writer.close()
                    status, seconds = await timed(http.get(f"{url}/healthz"))
                    print(f"  healthz after: HTTP {status} in {seconds * 1000:.0f} ms; proxy alive: {proxy.alive()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--files", type=int, default=1024, help="the proxy's open-file limit")
    p.add_argument("--header-timeout", type=float, default=3.0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
