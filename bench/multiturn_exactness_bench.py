"""Exact multi-turn trajectories, measured live: how often a rollout's next prompt does not start with its previous
prompt + response tokens, with the proxy's token continuation off and on, on two chat templates: the calc model's
(the history is a pure append) and one that drops past reasoning as Qwen3's does (`<think>...</think>` removed from
assistant turns before the last user message: not an append).

For each template a tiny model is warm-started on the calc agent's transcripts (for the stripping template every
answer opens with a short `<think>...</think>`) and served by the CPU vLLM engine behind the real ledger, proxy and
controller. Free-sampling agents (train mode, temperature 1, tasks the model never saw) run several turns each: a
parsed tool call gets the product as its result, any other answer a user nudge, so past reasoning is stripped from
the history. The recorded calls are aggregated as the trainer does (trajectory level). Per setting:

  continuations     calls that follow an earlier call of their rollout
  token breaks      of those, prompts that do not start with the previous prompt + response tokens
  text changed      of the breaks, those whose history's text changed too (only a separate segment is exact)
  proxy             token continuation outcomes (appended / spliced / diverged ...)
  segments          rows per rollout from the trainer's aggregation (mean, max)
  exact             every row starts at a call's prompt and trains exactly the calls' sampled tokens and log-probs

    .venv/bin/python bench/multiturn_exactness_bench.py [--rollouts 48] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.calc_agent.tasks import TOOLS, make_tasks, messages, tokenizer_corpus, transcripts  # noqa: E402
from services._gen.agl.v1 import model_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from services.engine.tiny_model import (  # noqa: E402
    CHAT_TEMPLATE,
    REASONING_STRIPPING_CHAT_TEMPLATE,
    TOOL_CALL_END,
    build_tiny_model,
)
from services.engine.warm_start import warm_start  # noqa: E402
from services.stack import local_stack  # noqa: E402
from services.trainer.data.aggregation import TRAJECTORY_BREAKS, rows_from_trace  # noqa: E402
from services.trainer.data.triplets import RolloutTrace, Triplet  # noqa: E402

KEY = "exactness-bench-key"
MODEL = "agl-policy"

# The agent: a turn that made a parsed call gets the product as the tool's result, any other a user nudge.
AGENT = """
import json, os, sys
import httpx
messages, tools, turns = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
url, auth = os.environ["AGL_OPENAI_BASE_URL"], {"authorization": "Bearer " + os.environ["AGL_KEY"]}
for turn in range(turns):
    body = {"model": "policy", "messages": messages, "tools": tools, "max_tokens": 48}
    reply = httpx.post(url + "/chat/completions", json=body, headers=auth, timeout=120)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    said = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        said["tool_calls"] = message["tool_calls"]
        messages += [said, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "1234"}]
    else:
        messages += [said, {"role": "user", "content": "Check it with the calculator."}]
"""


def build_model(directory: Path, *, thinking: bool) -> Path:
    """The calc model (12 tasks, most solved with the tool); `thinking`: the stripping template, and every answer
    opens with `<think>expression</think>`."""
    tasks = make_tasks(12, seed=11)
    corpus = tokenizer_corpus(tasks) + (["<think>1 * 2</think>"] * 8 if thinking else [])
    template = REASONING_STRIPPING_CHAT_TEMPLATE if thinking else CHAT_TEMPLATE
    build_tiny_model(directory, corpus=corpus, chat_template=template)
    examples = []
    for task in tasks:
        with_tool, without = transcripts(task)
        for chat, answer in with_tool + without:
            examples.append((chat, f"<think>{task['expression']}</think>{answer}" if thinking else answer))
    warm_start(directory, examples, steps=150, batch_size=16, lr=2e-3, tools=TOOLS)
    return directory


def start_stack(root: Path, model_dir: Path, continuation: bool) -> Any:
    specs = local_stack.load_compose({"AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL}, ["engine"])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller", "engine")}
    overrides = {
        "controller": {"AGL_CONTROLLER_LOG_DIR": str(root / "agents"), "AGL_CONTROLLER_MAX_CONCURRENCY": "16"},
        "proxy": {"AGL_PROXY_TOKEN_CONTINUATION": "true" if continuation else "false"},
        "engine": {"AGL_ENGINE_MODEL_DIR": str(model_dir), "AGL_ENGINE_MAX_MODEL_LEN": "512"},
    }
    plans = local_stack.localize(specs, root / "data", overrides)
    ledger_port = int(specs["ledger"].env["AGL_LEDGER_PORT"])
    engine_port = int(specs["engine"].env["AGL_ENGINE_PORT"])

    def register(name: str, running: Any) -> None:
        if name == "engine":
            ledger = running["ledger"].address(ledger_port)
            url = f"http://{running['engine'].address(engine_port)}/v1"

            async def add() -> None:
                async with LedgerClient(ledger, key=KEY) as client:
                    await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=url)])

            asyncio.run(add())

    order = [name for name in local_stack.start_order(specs) if name != "controller"] + ["controller"]
    stack = local_stack.run_stack(plans, order, root / "logs", health_timeout_s=300.0, when_healthy=register)
    return stack, specs


async def run_agents(ledger: str, tasks: list[dict[str, Any]], turns: int) -> list[tuple[Any, list[Any]]]:
    run = f"exact-{int(time.time())}"
    specs = [
        rollout_pb2.RolloutSpec(
            rollout_id=f"{run}-{i}",
            input_json="{}",
            is_train=True,
            config=rollout_pb2.RolloutConfig(
                timeout_seconds=300,
                local=rollout_pb2.LocalLaunchConfig(
                    command=[sys.executable, "-c", AGENT, json.dumps(messages(task)), json.dumps(TOOLS), str(turns)]
                ),
            ),
            metadata=rollout_pb2.RolloutMetadata(labels={"run": run}),
        )
        for i, task in enumerate(tasks)
    ]
    async with LedgerClient(ledger, key=KEY) as client:
        await client.create_rollouts(specs)
        finished = []
        async for entry in client.watch_terminal(labels={"run": run}, include_events=False):
            finished.append(entry.rollout)
            if len(finished) == len(specs):
                break
        return [
            (r, await client.list_events(r.rollout_id, attempt_id="*", event_type="model_request")) for r in finished
        ]


def proxy_outcomes(proxy_url: str) -> dict[str, float]:
    text = httpx.get(f"{proxy_url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    prefix = 'agl_proxy_token_continuations_total{outcome="'
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, value = line[len(prefix) :].split('"} ')
            out[name] = float(value)
    return out


def measure(results: list[tuple[Any, list[Any]]], tokenizer: Any) -> dict[str, Any]:
    continuations = breaks = changed = rows_total = 0
    segments: list[int] = []
    exact = True
    failed = 0
    for rollout, events in results:
        if rollout.status.state != rollout_pb2.ROLLOUT_STATE_SUCCEEDED:
            failed += 1
            continue
        calls = [e.model_request for e in events]
        for first, second in itertools.pairwise(calls):
            continuations += 1
            head = list(first.prompt_token_ids) + list(first.response_token_ids)
            if list(second.prompt_token_ids[: len(head)]) != head:
                breaks += 1
                head_text = tokenizer.decode(head).replace(TOOL_CALL_END, "")
                changed += (
                    not tokenizer.decode(second.prompt_token_ids).replace(TOOL_CALL_END, "").startswith(head_text)
                )
        triplets = [
            Triplet(list(c.prompt_token_ids), list(c.response_token_ids), list(c.response_logprobs), i)
            for i, c in enumerate(calls)
        ]
        trace = RolloutTrace(rollout.rollout_id, "g", "d", 0.0, triplets=triplets)
        counts: Counter[str] = Counter()
        rows = rows_from_trace(trace, "trajectory", max_prompt_length=4096, max_response_length=4096, counts=counts)
        segments.append(len(rows))
        rows_total += len(rows)
        # Exact: each row opens at a call's prompt, its trained tokens are the calls' sampled tokens in order with
        # their engine log-probs, and everything else in it is masked context.
        prompts = {tuple(c.prompt_token_ids) for c in calls}
        trained = [t for row in rows for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
        logprobs = [lp for row in rows for lp, m in zip(row.logprobs or [], row.response_mask, strict=False) if m]
        sampled = [t for c in calls for t in c.response_token_ids]
        engine_logprobs = [lp for c in calls for lp in c.response_logprobs]
        exact &= all(tuple(row.prompt_ids) in prompts for row in rows)
        exact &= trained == sampled and logprobs == engine_logprobs
        assert counts[TRAJECTORY_BREAKS] == len(rows) - 1
    return {
        "rollouts": len(results),
        "failed": failed,
        "continuations": continuations,
        "token_breaks": breaks,
        "text_changed": changed,
        "segments_mean": round(statistics.mean(segments), 3) if segments else None,
        "segments_max": max(segments, default=None),
        "rows": rows_total,
        "exact": exact,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=48)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    root = args.work_dir or Path(tempfile.mkdtemp(prefix="agl-exactness-"))
    tasks = make_tasks(args.rollouts, seed=5)
    report: dict[str, Any] = {}
    for template, thinking in (("calc (append)", False), ("strips past reasoning", True)):
        model_dir = root / ("thinking-model" if thinking else "calc-model")
        if not (model_dir / "config.json").exists():
            build_model(model_dir, thinking=thinking)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        for continuation in (False, True):
            name = f"{template}, token continuation {'on' if continuation else 'off'}"
            folder = root / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
            stack, specs = start_stack(folder, model_dir, continuation)
            with stack as running:
                ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
                proxy = "http://" + running["proxy"].address(int(specs["proxy"].env["AGL_PROXY_PORT"]))
                started = time.monotonic()
                results = asyncio.run(run_agents(ledger, tasks, args.turns))
                figures = measure(results, tokenizer)
                figures["seconds"] = round(time.monotonic() - started, 1)
                figures["proxy"] = proxy_outcomes(proxy)
            report[name] = figures
            print(name, json.dumps(figures), flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
