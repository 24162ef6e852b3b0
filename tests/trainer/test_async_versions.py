"""Issue 47 item 2 through the whole stack: in async mode a rollout whose calls span a weight push is recorded
with each call's version, and the staleness bound (agl.async_training.max_staleness=0) masks every token sampled
before the update's weights out of the loss, counted token for token, and drops the rows left with none.

One CPU run of 3 steps, 2 groups of 4 a step, 3 groups in flight. One group is "span" (tests/trainer/agents.py
SpanningAgent): its first call is sampled by the weights of step 1, its second waits for the push after step 1 and
is sampled by the next weights. Groups launched while a step trains can call before its push and are stale in the
next step too. What has to hold is read from the run's trajectory log (each call's recorded version and token
count), the step metrics and the proxy's token-continuation counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import run_trainer

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1200)]

# t1 is the span group: launched with step 1's groups (3 in flight), finished only after step 1's push. While its
# 4 rollouts wait they hold 4 of the controller's 8 slots (the compose file's), and t0 and t2 run in the other 4.
MODES = ["parity", "span", "parity", "parity", "parity", "parity", "parity"]


def continuations(proxy_url: str) -> dict[str, float]:
    """The proxy's agl_proxy_token_continuations by outcome: only a call continuing a turn of its rollout (here a
    span rollout's second call) counts."""
    text = httpx.get(f"{proxy_url}/metrics").text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "agl_proxy_token_continuations"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_calls_spanning_a_push_keep_their_versions_and_the_bound_masks_the_older_ones(
    tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "q": f"task {i}", "mode": mode, "engine": cpu_engine.url}) + "\n"
            for i, mode in enumerate(MODES)
        )
    )
    with cpu_stack.start(tmp_path_factory.mktemp("async-versions"), cpu_engine) as stack:
        run = run_trainer(
            stack,
            cpu_engine,
            "async-versions",
            tasks,
            steps=3,
            lr=1e-3,
            extra=[
                "agl.launch.agent_class=tests.trainer.agents:SpanningAgent",
                "agl.launch.timeout_seconds=600",
                "agl.async_training.enable=true",
                "agl.async_training.async_train_batch_size=3",
                "agl.async_training.max_staleness=0",
                # Two calls of up to 4 tokens and the turn between them fit in one row, uncut.
                "data.max_prompt_length=64",
                "actor_rollout_ref.rollout.response_length=64",
            ],
        )
        outcomes = continuations(stack.proxy_url)
    assert run.returncode == 0, run.output[-6000:]
    records = [json.loads(line) for line in run.trajectories.read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert sorted({r["step"] for r in train}) == [1, 2, 3]
    spans = [r for r in train if r["input"]["mode"] == "span"]
    assert len(spans) == 4 and len({r["step"] for r in spans}) == 1, spans  # one group, trained in one step
    for step in (1, 2, 3):
        metrics = run.step(step)
        version = int(metrics["agl/async/weights_version"])
        assert version == step - 1, metrics
        rows = [r for r in train if r["step"] == step]
        # The bound: every generated token sampled before this update's weights is masked, and counted.
        stale = sum(c["response_tokens"] for r in rows for c in r["calls"] if c["model_version"] < version)
        assert metrics["agl/async/stale_tokens_masked"] == stale, (step, metrics, stale)
        # After the bound nothing trained is behind.
        assert metrics["agl/async/staleness_max"] == 0, metrics
        assert metrics["agl/rollout/succeeded"] == 8, metrics
        span_rows = [r for r in rows if r["input"]["mode"] == "span"]
        for span in span_rows:
            # Its second call waited for the push after its first: two versions in one rollout, as recorded.
            first, second = (c["model_version"] for c in span["calls"])
            assert second == first + 1 <= version, span
        # Rows dropped: a one-call rollout's row when its call is stale. A span rollout whose second call continued
        # its first's tokens (appended, or spliced by the proxy) made one row of both: the stale call stays there
        # as context, and the row is dropped only when both calls are stale; one whose history the agent
        # re-rendered otherwise (diverged) made a row per call, each dropped when stale. Every rollout's calls were
        # sampled by one group-wide set of versions, so the proxy's run-wide outcome counts say which is which.
        dropped = sum(1 for r in rows if len(r["calls"]) == 1 and r["calls"][0]["model_version"] < version)
        if span_rows:
            (stale_per_span,) = {sum(c["model_version"] < version for c in r["calls"]) for r in span_rows}
            separate = outcomes.get("diverged", 0) + outcomes.get("unsupported", 0) + outcomes.get("failed", 0)
            merged = outcomes.get("appended", 0) + outcomes.get("spliced", 0)
            assert merged + separate == 4, outcomes
            dropped += separate * stale_per_span + merged * (stale_per_span == 2)
        assert metrics["agl/async/stale_rows_dropped"] == dropped, (step, metrics, outcomes)
