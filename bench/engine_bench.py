"""CPU engine benchmark: vLLM's CPU build (from .venv-engine) serving the tiny model, started as a user does.

Measures, on one engine:
  start:    `python -m services.engine` to /health answering 200, and the resident memory of its processes
  chat:     rounds of 64 concurrent chat calls (max_tokens tokens each, EOS ignored) -> calls/s and tokens/s
  reload:   weight pushes as the trainer does them (perturbed safetensors -> agl_reload_weights + reset of the
            prefix cache), seconds per push (target <= 0.2 s per engine)
  equality: after the last push, the engine's log-probs of sampled responses against Hugging Face
            transformers' (fp32, same weights): max |difference| (target <= 1e-4)

    .venv/bin/python bench/engine_bench.py [--rounds 3] [--reloads 10] [--max-tokens 32] [--hidden 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.engine.control import EngineControl  # noqa: E402
from tests.support.engine import (  # noqa: E402
    ENGINE_PYTHON,
    Engine,
    build_model,
    reference_logprobs,
    run_engine,
    write_perturbed_weights,
)

CONCURRENCY = 64


def group_rss_gib(pgid: int) -> float:
    """Resident memory of every process in the engine's process group (API server, engine core, worker)."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            status = (entry / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024 / 1024


def chat_body(engine: Engine, i: int, max_tokens: int) -> dict:
    return {
        "model": engine.model_name,
        "messages": [{"role": "user", "content": f"What is {i % 10} + {(i * 7) % 10}?"}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": i,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }


async def chat_round(engine: Engine, max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(
                client.post(f"{engine.openai_url}/chat/completions", json=chat_body(engine, i, max_tokens))
                for i in range(CONCURRENCY)
            )
        )
        elapsed = time.perf_counter() - started
    tokens = 0
    for answer in answers:
        answer.raise_for_status()
        tokens += len(answer.json()["choices"][0]["token_ids"])
    return elapsed, tokens


async def reloads(engine: Engine, dirs: list[Path]) -> list[float]:
    seconds = []
    async with EngineControl(engine.url) as control:
        for directory in dirs:
            started = time.perf_counter()
            await control.reload_weights(directory)
            await control.reset_prefix_cache()
            seconds.append(time.perf_counter() - started)
    return seconds


def logprob_gap(engine: Engine, weights: Path, samples: int) -> tuple[float, int]:
    worst, tokens = 0.0, 0
    for i in range(samples):
        answer = httpx.post(f"{engine.openai_url}/chat/completions", json=chat_body(engine, 1000 + i, 32), timeout=60)
        answer.raise_for_status()
        body = answer.json()
        choice = body["choices"][0]
        engine_lps = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        reference = reference_logprobs(engine.model_dir, weights, body["prompt_token_ids"], choice["token_ids"])
        worst = max(worst, *(abs(a - b) for a, b in zip(engine_lps, reference, strict=True)))
        tokens += len(engine_lps)
    return worst, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8, help="responses compared with transformers")
    args = parser.parse_args()
    if not ENGINE_PYTHON.is_file():
        sys.stderr.write(f"no engine venv at {ENGINE_PYTHON}: run `make engine-venv` first\n")
        return 2

    with tempfile.TemporaryDirectory(prefix="agl-engine-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "model", hidden=args.hidden, layers=args.layers)
        started = time.perf_counter()
        with run_engine(model_dir, log_dir=root) as engine:
            start_s = time.perf_counter() - started
            print(f"start: {start_s:.1f} s to /health (model hidden {args.hidden}, {args.layers} layers)")
            print(f"memory: {group_rss_gib(engine.proc.pid):.2f} GiB resident (engine process group)")

            asyncio.run(chat_round(engine, 4))  # warm-up
            for r in range(args.rounds):
                elapsed, tokens = asyncio.run(chat_round(engine, args.max_tokens))
                print(
                    f"chat round {r + 1}: {CONCURRENCY} concurrent calls x {args.max_tokens} tokens in {elapsed:.2f} s"
                    f" = {CONCURRENCY / elapsed:.0f} calls/s, {tokens / elapsed:,.0f} tokens/s"
                )

            dirs = [write_perturbed_weights(model_dir, root / f"w{i}", seed=i + 1) for i in range(args.reloads)]
            seconds = asyncio.run(reloads(engine, dirs))
            print(
                f"reload + prefix-cache reset: median {statistics.median(seconds):.3f} s, "
                f"max {max(seconds):.3f} s over {len(seconds)} pushes (target <= 0.2 s)"
            )
            worst, tokens = logprob_gap(engine, dirs[-1], args.samples)
            print(f"log-probs after the last push vs transformers: max |diff| {worst:.2e} over {tokens} tokens")
            print(f"memory after the run: {group_rss_gib(engine.proc.pid):.2f} GiB resident")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
