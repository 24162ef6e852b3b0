"""Three training steps of the unmodified calc agent (tool calls, tool results, answers) on CPU: `agl-trainer
placement=cpu` against the real ledger, proxy and controller and the session's calc engine (vLLM CPU with the
hermes tool-call parser). Rows are whole trajectories: each merges a rollout's turns with the tool results masked,
no call breaks its rollout's row, the engine's log-probs equal the trainer's on them, and the weights change."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.calc_agent.tasks import make_tasks
from services.stack import local_stack
from tests.support.engine import CALC_TASKS_SEED, Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, Stack, TrainerRun, max_weight_change, trainer_overrides

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]

TRAINER = Path(sys.executable).with_name("agl-trainer")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, calc_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("multiturn-training"), calc_engine) as started:
        yield started


def test_three_steps_of_the_calc_agent_train_on_whole_trajectories(
    stack: Stack, calc_engine: Engine, tmp_path: Path
) -> None:
    tasks = tmp_path / "calc.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in make_tasks(12, seed=CALC_TASKS_SEED)))
    out = stack.root / "calc3"
    out.mkdir()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}", "agl.aggregation.level=trajectory"]
    # The ~1 M-parameter model at lr 1e-3 sometimes collapses into unparsable calls by step 3 (seen once in CI: 18 of
    # 18 bad, a health stop). What is tested here is the data path of three steps, not the policy: that stop is off
    # (its warning stays), and the guardrail has tests of its own (test_guardrails.py).
    argv += ["+agl.health.limits.bad_tool_calls.stop=null"]
    argv += trainer_overrides(
        calc_engine,
        "calc3",
        tasks,
        out,
        steps=3,
        lr=1e-3,
        agent="examples.calc_agent.agent:CalcAgent",
        env_map={"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"},
        tasks_per_step=4,
        prompt_length=128,
        response_length=128,
        timeout_s=120,
    )
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=850, check=False)
    run = TrainerRun.read(proc.returncode, proc.stdout + proc.stderr, out)
    assert run.returncode == 0, run.output[-5000:]
    assert [r["step"] for r in run.metrics if r["step"] > 0] == [1, 2, 3]

    steps = [run.step(n) for n in (1, 2, 3)]
    for step in steps:
        assert step["agl/rollout/succeeded"] == 16.0, step
        # The template re-renders every tool call as the model wrote it, and where the tokens still differ (a
        # sampled split of a word other than the tokenizer's own) the proxy continues in the sampled tokens, so a
        # call continues its rollout's row. What remains is a history whose text changed (a garbled call the
        # parser read as JSON and the agent sent back re-serialised): rare, and an exact segment row of its own,
        # never a retokenized one. A template that did not round-trip would break nearly every multi-turn rollout
        # (~13 of 16 here).
        breaks = step["agl/data/trajectory_breaks"]
        assert breaks <= 4.0, step
        # One row per rollout plus one per break, less the rows dropped for an over-long prompt (a segment's prompt
        # is the whole history: after a long first turn it can pass the 128-token limit).
        assert step["agl/calls/failed"] == 0.0, step
        dropped = step.get("agl/data/dropped_prompt_too_long_rows", 0.0)
        assert step["agl/data/rows_built"] == 16 + breaks - dropped, step
    # The model calls its tool: rows hold several turns, the tool results inside them are masked context.
    # (Step 1 samples the warm start, which calls in ~60% of rollouts: 4 of 16 or fewer has a chance of ~3e-4.)
    assert max(step["agl/tools/call_rate"] for step in steps) >= 0.25
    assert max(step["agl/turns/max"] for step in steps) >= 2.0
    assert max(step["agl/data/context_tokens_per_row"] for step in steps) > 0.0
    updated = [step for step in steps if step["agl/update/skipped_no_signal"] == 0.0]
    assert updated, "no step had a learning signal"
    for step in updated:
        # Context tokens are masked out of the comparison: on the sampled tokens the engine and trainer agree.
        assert step["agl/push/logprob_diff_max"] < 1e-4, step
    assert max_weight_change(calc_engine.model_dir, run.weights_dir) > 0.0

    records = [json.loads(line) for line in run.trajectories.read_text().splitlines()]
    multi = [r for r in records if len(r["calls"]) >= 2]
    assert multi, "no rollout made more than one call"
