"""Long prompts on CPU: the long-context tiny model (65,536 positions) served by the CPU engine and trained by the
CPU trainer, at the sizes of a real harness's first prompt (13-19k tokens with their tokenizers, 20-40k with the
tiny model's byte-level one).

  engine:  `python -m services.engine` with --max-model-len 65536 to /health, the KV cache vLLM sets aside (its own
           log lines) and the engine's resident memory; then the prefill of one prompt of each --prefill size
           (completions with prompt token ids, max_tokens 1, distinct prompts so no prefix is cached), and the
           engine's log-probs at the prompt's end against transformers' (positions past 512 computed alike)
  trainer: `agl train` itself on one task whose agent sends a prompt of --row-tokens tokens: one GRPO step of
           --group rollouts, the trainer's step timings (verl's timing_s/*) and the peak resident memory of the
           actor's worker process (VmHWM)

    .venv/bin/python bench/long_context_bench.py engine [--prefill 20000 60000]
    .venv/bin/python bench/long_context_bench.py trainer [--row-tokens 20000] [--group 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_bench import group_rss_gib  # noqa: E402
from services.engine.tiny_model import LONG_POSITIONS, build_tiny_model  # noqa: E402
from tests.support.engine import ENGINE_PYTHON, reference_logprobs, run_engine  # noqa: E402

# vLLM's own lines about the KV cache it set aside (CPU: VLLM_CPU_KVCACHE_SPACE, AGL's --kv-cache-gib).
KV_LINES = re.compile(r"KV cache size|GiB for KV cache|init engine")


def prefill(url: str, model: str, tokens: int, vocab: int, seed: int) -> tuple[float, dict]:
    rng = random.Random(seed)
    ids = [rng.randrange(0, 256) for _ in range(tokens)]  # byte tokens: any sequence is valid
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1, "return_token_ids": True}
    started = time.perf_counter()
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=1800)
    took = time.perf_counter() - started
    answer.raise_for_status()
    return took, {"ids": ids, "body": answer.json()}


def engine_bench(args: argparse.Namespace) -> int:
    if not ENGINE_PYTHON.is_file():
        sys.stderr.write(f"no engine venv at {ENGINE_PYTHON}: run `make engine-venv` first\n")
        return 2
    with tempfile.TemporaryDirectory(prefix="agl-long-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "model", positions=LONG_POSITIONS)
        engine_args = ["--max-model-len", str(args.context), "--kv-cache-gib", str(args.kv_cache_gib)]
        started = time.perf_counter()
        with run_engine(model_dir, args=engine_args, log_dir=root, start_timeout_s=600) as engine:
            print(f"start: {time.perf_counter() - started:.1f} s to /health (--max-model-len {args.context}, "
                  f"--kv-cache-gib {args.kv_cache_gib})")  # fmt: skip
            print(f"memory: {group_rss_gib(engine.proc.pid):.2f} GiB resident (engine process group)")
            for line in engine.log_text().splitlines():
                if KV_LINES.search(line):
                    print(f"  vllm: {line.split('] ', 1)[-1].strip()}")
            prefill(engine.url, engine.model_name, 64, 256, seed=0)  # compiles what the first request compiles
            for index, tokens in enumerate(args.prefill):
                took, found = prefill(engine.url, engine.model_name, tokens, 256, seed=index + 1)
                usage = found["body"]["usage"]["prompt_tokens"]
                print(f"prefill: {usage:,} tokens in {took:.1f} s ({usage / took:,.0f} tokens/s)")
                print(f"memory: {group_rss_gib(engine.proc.pid):.2f} GiB resident after it")
                if args.check_logprobs and tokens <= args.check_logprobs:
                    choice = found["body"]["choices"][0]
                    answer = choice["token_ids"]
                    engine_lp = choice["logprobs"]["token_logprobs"]
                    ref = reference_logprobs(model_dir, model_dir, found["ids"], answer)
                    print(f"  log-prob of its answer vs transformers: |diff| {abs(engine_lp[0] - ref[0]):.2e}")
    return 0


# -- the trainer: agl train on one long-prompt task ------------------------------------------------------------

AGENT = '''
import os, random

import httpx
from openai import OpenAI


class LongPrompt:
    """A harness-sized first prompt (a system prompt of --row-tokens bytes), one call, a reward in [0, 1) (every
    group's rewards differ, so every step updates)."""

    def run(self):
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0)
        system = (os.environ["LONG_TEXT"] * 100000)[: int(os.environ["LONG_CHARS"])]
        client.chat.completions.create(
            model="any", max_tokens=8,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "go"}],
        )
        return random.random()
'''


def peak_worker_memory(stop: threading.Event, peaks: dict[str, float], marker: bytes) -> None:
    """The largest VmHWM seen of each Ray worker process of this run (the actor runs in one), in GiB: a process of
    this run has the run's folder in its environment (the trainer's VERL_FILE_LOGGER_PATH, which Ray passes on), so
    other runs' Ray workers on the same machine are left out."""
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if not cmdline.startswith("ray::") or marker not in (entry / "environ").read_bytes():
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    name = cmdline.split()[0]
                    peaks[name] = max(peaks.get(name, 0.0), int(line.split()[1]) / 1024 / 1024)
        stop.wait(1.0)


def trainer_bench(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="agl-long-train-"))
    (root / "longagent.py").write_text(AGENT)
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(2)))
    prompt = args.row_tokens + 64
    argv = [str(Path(sys.executable).parent / "agl"), "train", "--agent-class", "longagent:LongPrompt"]
    argv += ["--data", str(tasks), "--steps", "1", "--tasks-per-step", "1", "--group-size", str(args.group)]
    argv += ["--max-prompt-length", str(prompt), "--max-response-length", "64", "--allow-no-learning"]
    argv += ["--output", str(root / "run")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env.update({"PYTHONPATH": str(REPO), "LONG_TEXT": "the quick brown fox jumps over the lazy dog. "})
    env["LONG_CHARS"] = str(args.row_tokens)
    peaks: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=peak_worker_memory, args=(stop, peaks, str(root).encode()), daemon=True)
    watcher.start()
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    stop.set()
    took = time.perf_counter() - started
    print(result.stdout[-4000:])
    if result.returncode != 0:
        print(result.stderr[-3000:])
    print(f"agl train: exit {result.returncode} in {took:.0f} s (one step, {args.group} rollouts)")
    metrics = root / "run" / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = {"step": json.loads(line)["step"], **json.loads(line)["data"]}
            timing = {k: round(v, 1) for k, v in record.items() if k.startswith("timing_s/")}
            lengths = {k: v for k, v in record.items() if "length" in k or "memory" in k}
            print(f"step {record.get('step')}: {timing} {lengths}")
    for name, gib in sorted(peaks.items(), key=lambda item: -item[1])[:4]:
        print(f"peak resident: {name} {gib:.2f} GiB")
    if args.keep:
        print(f"run folder: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return result.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    engine = sub.add_parser("engine")
    engine.add_argument("--context", type=int, default=LONG_POSITIONS)
    engine.add_argument("--kv-cache-gib", type=int, default=1)
    engine.add_argument("--prefill", type=int, nargs="+", default=[20_000, 60_000])
    engine.add_argument("--check-logprobs", type=int, default=20_000, help="compare with transformers up to this")
    trainer = sub.add_parser("trainer")
    trainer.add_argument("--row-tokens", type=int, default=20_000)
    trainer.add_argument("--group", type=int, default=2)
    trainer.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    return engine_bench(args) if args.part == "engine" else trainer_bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
