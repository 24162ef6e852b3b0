"""`agl train`, `agl eval` and `agl export` as a user runs them: an agent written here (its own field names and
environment variables) in a folder of its own, a task file, the installed `agl` started in that folder. Every
service is the real one, started by the command; the engine is the CPU vLLM serving a tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient
from tests.support.procs import processes_mentioning, start_ledger

AGL = Path(sys.executable).parent / "agl"
# Each training run starts every service, the CPU engine and the trainer (minutes on two cores).
pytestmark = pytest.mark.timeout(1500)

SHOP_AGENT = '''
"""A user's agent: it knows nothing of AGL but the three variables every v1.0 agent reads."""
import os

import httpx
from openai import OpenAI


class ShopAgent:
    def run(self):
        if os.environ.get("SHOP_MODE") == "closed":
            raise RuntimeError("the shop is closed today")
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"])
        question = f"shop clerk, count: {os.environ['SHOP_PROBLEM']}"
        reply = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": question}], max_tokens=12
        ).choices[0].message.content or ""
        want = os.environ["SHOP_SOLUTION"]
        # Full marks for the answer, else a little for the reply's length: a random model's groups then get rewards
        # that differ (a learning signal) on every step.
        reward = 1.0 if want in reply else min(0.5, len(reply) / 100)
        if os.environ.get("SHOP_MODE") == "flat":  # a reward that never varies: nothing for GRPO to learn
            reward = 0.0
        httpx.post(
            os.environ["AGL_EVENT_URL"],
            json={"event_type": "reward", "data": {"value": reward}},
            headers={"authorization": "Bearer " + os.environ["AGL_KEY"]},
            timeout=30,
        ).raise_for_status()


class NoRun:
    pass
'''


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's folder: the agent package and 40 tasks with the user's own field names."""
    package = tmp_path / "shopagent"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(SHOP_AGENT)
    with (tmp_path / "shop.jsonl").open("w") as tasks:
        for index in range(40):
            a, b = index % 7 + 1, index % 5 + 2
            tasks.write(json.dumps({"problem": f"{a} apples and {b} pears", "solution": str(a + b)}) + "\n")
    # Supervised examples in the agent's own words (its prompt, the answer wanted).
    with (tmp_path / "shop-sft.jsonl").open("w") as examples:
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 2), (2, 5)]:
            prompt = f"shop clerk, count: {a} apples and {b} pears"
            examples.write(json.dumps({"prompt": prompt, "answer": str(a + b)}) + "\n")
    return tmp_path


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_") and key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # this checkout's code, as the installed script runs
    return env


def agl(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGL), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


AGENT = ["--agent-class", "shopagent.agent:ShopAgent"]
ENV_MAP = ["--env-map", "SHOP_PROBLEM=input.problem", "--env-map", "SHOP_SOLUTION=input.solution"]
SMALL = ["--tasks-per-step", "4", "--group-size", "4", "--max-prompt-length", "96", "--max-response-length", "32"]


async def _ledger_run(output: Path, run_id: str) -> run_pb2.Run:
    """The run as the run's own ledger stored it (its SQLite file in the run folder), read by a ledger started on it."""
    key = (output / "key").read_text().strip()
    database = next((output / "stack").rglob("ledger.db"))
    with start_ledger(store=f"sqlite:{database}", key=key) as ledger:
        async with LedgerClient(ledger.address, key) as client:
            return await client.get_run(run_id)


def test_train_runs_the_users_agent_on_their_tasks_then_export_and_eval(workdir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    argv = ["train", *AGENT, "--data", "shop.jsonl", "--val", "shop.jsonl", *ENV_MAP, *SMALL]
    argv += ["--sft-data", "shop-sft.jsonl", "--sft-steps", "20", "--report-to", "tensorboard"]
    argv += ["--steps", "2", "--val-every", "2", "--run-id", "shop1", "agl.val_max_samples=8"]
    # What a GPU run saves (its engines get the weights in memory): the HF weights with each checkpoint.
    argv += ["actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    result = agl(*argv, cwd=workdir)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    output = workdir / "agl-runs" / "shop1"
    assert "supervised start: 5 examples, 20 steps of 5 at lr 0.001" in out
    assert "supervised start: step 20/20, loss " in out
    assert re.search(r"pre-flight: [1-4] of 4 groups \(4 tasks x 4 samples\) with rewards that differ", out), out
    # The first prompt measured before training (prompt_fit.py), within the run's row limit.
    assert re.search(r"smoke rollout: ok \(1 model call\(s\), first prompt \d+ tokens of --max-prompt-length 96, ", out)
    assert "console: http://127.0.0.1:" in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps[0].startswith("step   0/2  held-out reward") and "(before training)" in steps[0]
    assert [line.split()[1] for line in steps[1:]] == ["1/2", "2/2"]
    assert "eta " in steps[1] and "[####################] 2/2" in steps[2]
    assert "Traceback" not in out + result.stderr

    # The rollouts ran this agent on these tasks: the prompts hold its own text and the task's fields.
    records = [json.loads(line) for line in (output / "trajectories.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 * 4 * 4
    for record in train:
        (call,) = record["calls"]
        assert f"shop clerk, count: {record['input']['problem']}" in call["prompt"]
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # --report-to tensorboard: the same steps as TensorBoard event files in the run folder.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (output / "tensorboard").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("critic/score/mean")] == [1, 2]

    run = json.loads((output / "run.json").read_text())
    assert run["state"] == "succeeded" and run["run_id"] == "shop1"
    assert run["base_model"] == str(output / "supervised-model")  # the run trained from the supervised start
    stored = asyncio.run(_ledger_run(output, "shop1"))
    assert stored.state == run_pb2.RUN_STATE_SUCCEEDED

    # The services stopped with agl train; the run is read again from its folder's stored ledger.
    listed = agl("runs", "--from", str(output), cwd=workdir, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^shop1\s+succeeded\s+3\s+2\s", listed.stdout, re.MULTILINE), listed.stdout
    opened = _start(["open", "shop1"], workdir)  # a run id: agl-runs/shop1
    assert opened.stdout is not None
    lines = [opened.stdout.readline() for _ in range(4)]
    console_url = lines[1].split()[1]
    assert lines[1].startswith("console: http://127.0.0.1:") and lines[3] == "Ctrl-C stops them\n", lines
    assert httpx.get(console_url, timeout=10).status_code in (200, 303)  # the sign-in page or its redirect
    opened.send_signal(signal.SIGINT)
    opened.communicate(timeout=60)  # waits, and closes its pipes
    assert opened.returncode == 0
    assert processes_mentioning(str(output / "stack")) == []

    # The run kept its best validation's weights (steps 0 and 2 validated) and model/ holds them; the line says so.
    best = json.loads((output / "best" / "best.json").read_text())
    assert [step for step, _ in best["validations"]] == [0, 2], best
    assert best["reward"] == max(reward for _, reward in best["validations"])
    assert best["step"] == min(step for step, reward in best["validations"] if reward == best["reward"])
    assert f"weights: the weights of step {best['step']}, the best held-out reward ({best['reward']:.3f}) of 2 " in out
    assert run["exported_weights"] == "best"
    from safetensors.torch import load_file

    exported_best = load_file(str(output / "model" / "model.safetensors"))
    kept = load_file(str(output / "best" / "model.safetensors"))
    assert exported_best.keys() == kept.keys() and all(torch.equal(exported_best[k], kept[k]) for k in kept)

    # The model: loads in transformers, in the dtype it was trained in, with the tokenizer and chat template.
    model_dir = output / "model"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert str(next(model.parameters()).dtype) == "torch.float32"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)

    exported = agl("export", "shop1", "--to", str(workdir / "bf16"), "--dtype", "bfloat16", cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    half = AutoModelForCausalLM.from_pretrained(workdir / "bf16")
    assert str(next(half.parameters()).dtype) == "torch.bfloat16"
    assert json.loads((workdir / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"

    # --weights last: the last step's, the file last pushed to the engine.
    pushed = output / "state" / "weights" / "model.safetensors"
    last = agl("export", "shop1", "--weights", "last", "--to", str(workdir / "last"), cwd=workdir)
    assert last.returncode == 0 and "weights: the last step's weights, as asked" in last.stdout, last.stderr
    tensors_last, tensors_pushed = load_file(str(workdir / "last" / "model.safetensors")), load_file(str(pushed))
    assert all(torch.equal(tensors_last[k], tensors_pushed[k]) for k in tensors_pushed)

    # Without the pushed weights file (a GPU run has none), export takes the newest checkpoint's HF weights: the
    # same tensors, since the last step's checkpoint is saved after its update.
    aside = workdir / "pushed.safetensors"
    pushed.rename(aside)
    from_checkpoint = agl("export", str(output), "--weights", "last", "--to", str(workdir / "from-ckpt"), cwd=workdir)
    assert from_checkpoint.returncode == 0, from_checkpoint.stderr
    saved = {}
    for shard in (workdir / "from-ckpt").glob("*.safetensors"):
        saved.update(load_file(str(shard)))
    expected = load_file(str(aside))
    shared = set(saved) & set(expected)
    assert len(shared) >= len(expected) - 1  # a tied lm_head may be left out of one of them
    assert all(torch.equal(saved[name], expected[name]) for name in shared)
    AutoModelForCausalLM.from_pretrained(workdir / "from-ckpt")
    aside.rename(pushed)

    # Scored against the model it was trained from (--baseline: its weights loaded into the same engine).
    base = output / "supervised-model"
    argv = ["eval", "--model", str(workdir / "last"), "--baseline", str(base), *AGENT, "--data", "shop.jsonl"]
    scored = agl(*argv, *ENV_MAP, cwd=workdir)
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    assert "mean reward " in scored.stdout and "over 40 tasks (40 rewarded, 0 failed" in scored.stdout
    results_path = Path(scored.stdout.split("per task: ")[1].split()[0])
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert [row["task"] for row in rows] == list(range(40))
    assert all(row["state"] == "succeeded" and isinstance(row["reward"], float) for row in rows)
    mean = float(scored.stdout.split("mean reward ")[1].split()[0])
    assert abs(mean - sum(row["reward"] for row in rows) / 40) < 1e-3
    base_rows = [json.loads(line) for line in (results_path.parent / "baseline.jsonl").read_text().splitlines()]
    assert [row["task"] for row in base_rows] == list(range(40))
    base_mean = float(scored.stdout.split("baseline: mean reward ")[1].split()[0])
    assert abs(base_mean - sum(row["reward"] for row in base_rows) / 40) < 1e-3
    better = sum(a["reward"] > b["reward"] for a, b in zip(rows, base_rows, strict=True))
    worse = sum(a["reward"] < b["reward"] for a, b in zip(rows, base_rows, strict=True))
    assert f"against the baseline: {mean - base_mean:+.3f} ({better} tasks better, {worse} worse, " in scored.stdout
    # The baseline's calls were served by the weights loaded for it (the version its reload was labelled with).
    assert {r["model_version"] for r in rows} == {0} and {r["model_version"] for r in base_rows} == {1}
    assert processes_mentioning(str(workdir)) == [], "agl left processes running"


def test_lora_rank_trains_an_adapter_the_engine_serves_and_merges_it_on_request(workdir: Path) -> None:
    """`agl train --lora-rank 8`: the engine serves the base model and the run's adapter (from before the smoke
    rollout: one with zero B, the base model's function), the trainer trains and pushes the adapter only, and the
    run ends with the adapter as a PEFT directory and, asked for, the base model with it merged in."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    argv = ["train", *AGENT, "--data", "shop.jsonl", *ENV_MAP, *SMALL, "--steps", "2", "--run-id", "shoplora"]
    # Validated every step (the best adapter is kept), the last step's adapter exported (the checks below want one
    # that trained; the best may be the start's).
    argv += ["--lora-rank", "8", "--merge-adapter", "--val", "shop.jsonl", "--val-every", "1"]
    argv += ["--export-weights", "last", "actor_rollout_ref.actor.optim.lr=1e-2", "agl.val_max_samples=4"]
    result = agl(*argv, cwd=workdir)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert "smoke rollout: ok (1 model call(s)" in out and "Traceback" not in out + result.stderr
    output = workdir / "agl-runs" / "shoplora"
    run = json.loads((output / "run.json").read_text())
    assert run["state"] == "succeeded" and run["lora_rank"] == 8
    base = Path(run["base_model"])
    metrics = {m["step"]: m["data"] for m in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())}
    for step in (1, 2):
        # The rows were sampled through the adapter the engine loaded last: its log-probs are the trainer's.
        assert metrics[step]["agl/push/logprob_diff_max"] < 1e-4, metrics[step]
        assert metrics[step]["agl/push/bytes"] < 0.5 * (base / "model.safetensors").stat().st_size
    assert "model.safetensors" not in {p.name for p in (output / "state" / "weights").iterdir()}

    adapter = output / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["base_model_name_or_path"] == str(base)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert max(float(t.abs().max()) for name, t in tensors.items() if ".lora_B." in name) > 0.0  # it trained

    # The merged model is the base model with the adapter applied, as PEFT computes it, and not the base model.
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    reference = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        base_logits = reference(ids).logits
        adapted = PeftModel.from_pretrained(reference, str(adapter))(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(output / "model", dtype=torch.float32)(ids).logits
    assert float((merged - adapted).abs().max()) < 1e-4
    assert float((merged - base_logits).abs().max()) > 1e-4

    exported = agl("export", "shoplora", "--to", str(workdir / "exported-adapter"), cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    assert load_file(str(workdir / "exported-adapter" / "adapter_model.safetensors")).keys() == tensors.keys()
    refused = agl("export", "shoplora", "--dtype", "bfloat16", cwd=workdir)
    assert refused.returncode == 2 and "add --merge-adapter" in refused.stderr, refused.stderr
    # The best validation's adapter, kept by the trainer, is what `agl export` takes by default.
    best = json.loads((output / "best" / "best.json").read_text())
    assert [step for step, _ in best["validations"]] == [0, 1, 2], best
    assert agl("export", "shoplora", "--to", str(workdir / "best-adapter"), cwd=workdir).returncode == 0
    chosen = load_file(str(workdir / "best-adapter" / "adapter_model.safetensors"))
    kept = load_file(str(output / "best" / "adapter" / "adapter_model.safetensors"))
    assert chosen.keys() == kept.keys() and all(torch.equal(chosen[k], kept[k]) for k in kept)
    assert processes_mentioning(str(workdir)) == [], "agl left processes running"


def _start(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(AGL), *argv], cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_detached_run_is_listed_followed_stopped_and_resumed_to_the_end(workdir: Path) -> None:
    """agl train --detach, then what a user does with it: agl runs --local, agl logs -f, agl stop (SIGTERM to the run's
    process group, what `timeout`, systemd and Kubernetes send; Ctrl-C takes the same handler, both signals tested in
    test_signals.py and run end to end by agl try's Ctrl-C test), and --resume in the foreground."""
    argv = ["train", *AGENT, "--data", "shop.jsonl", *ENV_MAP, *SMALL, "--steps", "3", "--save-every", "1"]
    argv += ["--run-id", "shop2"]
    output = workdir / "agl-runs" / "shop2"

    started = agl(*argv, "--detach", cwd=workdir, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "run shop2 started in the background (pid " in started.stdout and "agl logs shop2 -f" in started.stdout
    deadline = time.monotonic() + 300
    listed = ""
    while time.monotonic() < deadline and not re.search(r"^shop2\s+running\s", listed, re.MULTILINE):
        time.sleep(1)
        listed = agl("runs", "--local", cwd=workdir, timeout=60).stdout
    assert re.search(r"^shop2\s+running\s", listed, re.MULTILINE), listed

    follow = _start(["logs", "shop2", "-f"], workdir)
    assert follow.stdout is not None
    seen = []
    while not seen or not seen[-1].startswith("step   1/3"):
        line = follow.stdout.readline()
        assert line, "".join(seen)
        seen.append(line)
    stopped = agl("stop", "shop2", cwd=workdir, timeout=300)
    said = re.search(r"run shop2 stopped after step (\d) \(state: interrupted\); continue it: ", stopped.stdout)
    assert stopped.returncode == 0 and said, stopped.stdout + stopped.stderr
    step = int(said[1])  # 1, or 2 if the next step ended between the line and the signal
    rest, _ = follow.communicate(timeout=60)  # -f ends with the run
    log = "".join(seen) + rest
    assert follow.returncode == 0 and f"interrupted by SIGTERM after step {step}" in log, log[-3000:]
    assert "Traceback" not in log, log
    assert json.loads((output / "run.json").read_text())["state"] == "interrupted"
    stored = asyncio.run(_ledger_run(output, "shop2"))
    assert stored.state == run_pb2.RUN_STATE_FAILED and "interrupted by SIGTERM" in stored.error_message
    assert processes_mentioning(str(workdir)) == []
    assert re.search(rf"^shop2\s+interrupted\s+{step}\s", agl("runs", "--local", cwd=workdir).stdout, re.MULTILINE)
    again = agl("stop", "shop2", cwd=workdir, timeout=60)
    assert again.returncode == 1 and "run shop2 is not running (state: interrupted)" in again.stdout

    again = agl(*argv, cwd=workdir, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr and "--resume" in again.stderr

    final = agl(*argv, "--resume", cwd=workdir)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-2000:]
    assert "resuming" in final.stdout and "pre-flight" not in final.stdout
    # It went on from the checkpoint of the step it stopped after: that step was not trained again.
    firsts = [line for line in final.stdout.splitlines() if line.startswith(f"step   {step}/3")]
    assert firsts == [f"step   {step}/3  (resumed from the checkpoint of step {step})"], final.stdout
    assert "step   3/3  reward " in final.stdout
    steps = [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s > 0][-1] == 3 and sorted(set(steps)) == [0, 1, 2, 3]
    assert asyncio.run(_ledger_run(output, "shop2")).state == run_pb2.RUN_STATE_SUCCEEDED
    assert (output / "model" / "model.safetensors").is_file()
    assert processes_mentioning(str(workdir)) == []


def test_an_agent_that_fails_stops_before_training_with_its_own_error(workdir: Path) -> None:
    argv = ["train", *AGENT, "--data", "shop.jsonl", *ENV_MAP, "--env-map", "SHOP_MODE=closed", *SMALL]
    result = agl(*argv, "--run-id", "closed", cwd=workdir)
    assert result.returncode == 2, result.stdout[-3000:]
    line = next(line for line in result.stdout.splitlines() if "smoke rollout failed" in line)
    assert "RuntimeError: the shop is closed today" in line
    log = Path(re.search(r"\((?:agent )?log: ([^)]+)\)", line).group(1))  # type: ignore[union-attr]
    assert log.is_file() and "the shop is closed today" in log.read_text()
    assert "run closed: " not in result.stdout  # the trainer never started
    assert json.loads((workdir / "agl-runs" / "closed" / "run.json").read_text())["state"] == "failed"
    assert processes_mentioning(str(workdir)) == []


def test_a_start_whose_rewards_never_differ_is_refused_by_the_preflight(workdir: Path) -> None:
    # Four tasks: the pre-flight samples them all in its first round and has no more to try.
    (workdir / "four.jsonl").write_text("".join((workdir / "shop.jsonl").read_text().splitlines(True)[:4]))
    argv = ["train", *AGENT, "--data", "four.jsonl", *ENV_MAP, "--env-map", "SHOP_MODE=flat", *SMALL]
    result = agl(*argv, "--run-id", "flat", cwd=workdir)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "smoke rollout: ok" in result.stdout
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("agl train: ")]
    assert line.startswith("agl train: the start cannot learn: no group of 4 (4 tasks x 4 samples) had rewards")
    assert "(every reward 0)" in line and "--sft-data FILE" in line
    assert "run flat: " not in result.stdout  # the trainer never started
    run = json.loads((workdir / "agl-runs" / "flat" / "run.json").read_text())
    assert run["state"] == "failed" and "cannot learn" in run["error"]
    assert processes_mentioning(str(workdir)) == []


def _bad_inputs(workdir: Path) -> list[tuple[list[str], str]]:
    (workdir / "broken.jsonl").write_text('{"problem": "1", "solution": "1"}\n{"problem": oops}\n')
    (workdir / "nochat").mkdir()
    (workdir / "nochat" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (workdir / "nochat" / "model.safetensors").write_bytes(b"")
    (workdir / "agl-runs" / "taken").mkdir(parents=True)
    (workdir / "agl-runs" / "taken" / "run.json").write_text(json.dumps({"run_id": "taken"}))
    (workdir / "bad.yaml").write_text("steps: 2\nwarp_speed: 9\n")
    data = ["--data", "shop.jsonl", *ENV_MAP]
    return [
        (["--data", "broken.jsonl", *AGENT, *ENV_MAP], "broken.jsonl:2: not valid JSON"),
        ([*data, *AGENT, "--env-map", "SHOP_COLOR=input.color"], "shop.jsonl:1: --env-map: env_map path"),
        ([*data, *AGENT, "--model", str(workdir / "missing")], "no such directory"),
        ([*data, *AGENT, "--model", str(workdir / "nochat")], "has no chat template"),
        ([*data, "--agent-class", "shopagent.agnet:ShopAgent"], "No module named 'shopagent.agnet'"),
        ([*data, "--agent-class", "shopagent.agent:NoRun"], "has no run() method"),
        ([*data, "--command", "no-such-agent-binary --fast"], "'no-such-agent-binary' is not on PATH"),
        ([*data, *AGENT, "--output", str(workdir / "shop.jsonl" / "run")], "not writable"),
        ([*data, *AGENT, "--run-id", "taken"], "run taken already exists"),
        ([*data, *AGENT, "--run-id", "nothing", "--resume"], "no run to continue"),
        ([*data, *AGENT, "--config", "bad.yaml"], "unknown option(s) warp_speed"),
        ([*data], "say which agent to run"),
        ([*data, *AGENT, "--val-every", "5"], "--val-every scores the held-out tasks: give them with --val FILE"),
        ([*data, *AGENT, "--export-weights", "best"], "--export-weights best takes the weights of the best held-out"),
        ([*data, *AGENT, "--val", "shop.jsonl", "--val-every", "0", "--export-weights", "best"], "--val-every N > 0"),
        (["--data", "shop.jsonl", *AGENT, *ENV_MAP, "--tasks-per-step", "41"], "40 tasks, fewer than --tasks-per"),
        ([*data, *AGENT, "trainer.seed"], "neither an option nor a Hydra override"),
        ([*data, *AGENT, "--lora-alpha", "16"], "--lora-alpha applies to a LoRA run: give --lora-rank R"),
        ([*data, *AGENT, "--merge-adapter"], "--merge-adapter applies to a LoRA run: give --lora-rank R"),
        ([*data, *AGENT, "--lora-rank", "8", "--export-dtype", "bfloat16"], "the merged model's dtype in a LoRA run"),
        ([*data, *AGENT, "--report-to", "comet"], "--report-to 'comet': one of tensorboard, wandb, mlflow"),
        ([*data, *AGENT, "--sft-steps", "5"], "--sft-steps applies to a supervised start: give --sft-data FILE"),
        ([*data, *AGENT, "--sft-data", "none.jsonl"], "--sft-data none.jsonl: no such file"),
        ([*data, *AGENT, "--sft-data", "broken.jsonl"], "--sft-data broken.jsonl line 1: "),
        ([*data, *AGENT, "--max-prompt-length", "65536"], "more than the tiny model's 65,536 positions hold"),
        # What only the trainer knows, refused in seconds, not after the stack, the start and the smoke rollout.
        (
            [*data, *AGENT, "agl.async_training.max_staleness=2"],
            "the trainer would refuse this run: agl.async_training",
        ),
        ([*data, *AGENT, "trainer.no_such_setting=1"], "the trainer's config does not take these overrides: "),
    ]


def test_each_bad_input_is_one_line_and_exit_2_before_anything_starts(workdir: Path) -> None:
    for argv, expected in _bad_inputs(workdir):
        started = time.monotonic()
        result = agl("train", *argv, cwd=workdir, timeout=120)
        took = time.monotonic() - started
        assert result.returncode == 2, (argv, result.stdout[-2000:], result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("agl: "), (argv, result.stderr)
        assert expected in lines[0], (argv, lines[0])
        assert "starting ledger" not in result.stdout, argv
        print(f"{took:5.1f}s  {lines[0]}")
    assert processes_mentioning(str(workdir)) == []
