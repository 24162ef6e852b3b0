"""GPU smoke run: two steps of the real `AglPPOTrainer.fit` on one GPU, colocated (verl's own vLLM replica
beside the actor, weights through verl's checkpoint engine), the unmodified math agent as processes through
the ledger, proxy and controller. Prepared to run as is on a machine with one NVIDIA GPU and the trainer
image's packages (verl 0.9.1, vLLM for CUDA, Ray); it needs no network: the tiny model is made here.
It has not yet run on a GPU: its checks are tested on CPU only (tests/trainer/test_gpu_smoke_checks.py).

    python tools/gpu_smoke.py [--steps 2] [--model /path/to/hf-model] [--data-dir data/gpu-smoke] [--no-resume]

Prints the toolchain (torch, CUDA, triton, the C compiler, the GPU), a table of each step's phase times
(timing_s/*) and each step's log-prob gaps, and checks, each as PASS or FAIL (tools/gpu_checks.py):
- a torch.compile'd function (inductor, so a triton kernel built with the C compiler) equals eager on the GPU;
- the trainer's last launch exits 0; every step updated or was skipped for no signal, and one updated;
- on every updated step the engine/actor gap is under its limit (agl/push/logprob_diff_mean and verl's
  training/rollout_probs_diff_mean);
- every step paused and drained the proxies before its weight update (agl/proxy/drained, drain_s printed);
- every replica's GET /v1/models serves the routed model name, and a chat call with tool choice "auto" is
  accepted, so a tool parser is on (both asked while the first launch's replicas serve; which parser is not said);
- the replicas are registered at the last step's version; only the retained steps' rollouts are left;
- no proxy pause is left in the ledger at the end;
- the replicas slept before every update and each sleep freed GPU memory (vLLM's own log line, in the trainer's);
- with --resume (the default): checkpoints every step, the trainer's process group is killed once step 1 is on
  record and checkpointed, the same command is started again, and it rewinds to step 1 and trains only the later
  steps (each step on record once).
- each replica's greedy continuation of a prompt, asked as soon as the first launch registers it (after its first
  weight sync; version 0 before and after the call), equals Hugging Face generate on the model directory
  (tools/gpu_greedy.py);
- GPU memory in use before and after the replicas' first sleep (vLLM's line) and after their wake (measured here
  once step 1 is on record): the wake takes back at least half of what the sleep freed;
- each replica server verl started was given agl.tool_calls.parser (hermes) and the routed name (verl prints its
  `vllm serve` arguments to the trainer's log).
Exit code 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services._gen.agl.v1 import proxy_control_pb2  # noqa: E402
from services.cli.train import session  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from services.stack import local_stack  # noqa: E402
from tools import demo_train, gpu_checks, gpu_greedy  # noqa: E402

# agl.retention.keep_steps of agl_trainer.yaml (not overridden here).
KEEP_STEPS = 2
# agl.tool_calls.parser of agl_trainer.yaml (not overridden here).
TOOL_PARSER = "hermes"
# The resume check: the trainer's process group is killed once this step is on record and checkpointed.
KILL_AFTER = 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face model dir (default: made here)")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / "data" / "gpu-smoke")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=True,
        help=f"checkpoint every step, kill the trainer after step {KILL_AFTER} and start it again",
    )  # fmt: skip
    return parser.parse_args(argv)


def overrides(
    args: argparse.Namespace, run_id: str, ledger: str, key: str, model: Path, tasks: Path, *, save: bool = False
) -> list[str]:
    state = args.data_dir.resolve() / "runs" / run_id
    items = [
        f"agl.run_id={run_id}",
        f"agl.ledger_address={ledger}",
        f"agl.launch.agent_class={demo_train.MATH_AGENT}",
        *(f"+agl.launch.env_map.{name}={path}" for name, path in demo_train.TASK_ENV.items()),
        "agl.launch.timeout_seconds=120",
        f"agl.state_dir={state / 'manager'}",
        f"agl.trajectory_log={state / 'trajectories.jsonl'}",
        "agl.progress=false",
        f"data.train_files={tasks}",
        "data.train_batch_size=4",
        "data.max_prompt_length=128",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=32",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        # A short run: no CUDA graph capture in vLLM and no torch.compile of the actor (minutes of compiling).
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={1 if save else -1}",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={state / 'checkpoints'}",
    ]
    if key:
        items.append(f"agl.key={key}")
    return items


def steps_trained_or_skipped(steps: dict[int, dict[str, Any]], total: int) -> tuple[bool, str]:
    """Every step has actor metrics, or was skipped for no learning signal (by design); at least one updated."""
    updated = [n for n in range(1, total + 1) if "actor/pg_loss" in steps.get(n, {})]
    skipped = [n for n in range(1, total + 1) if steps.get(n, {}).get("agl/update/skipped_no_signal") == 1.0]
    missing = [n for n in range(1, total + 1) if n not in updated and n not in skipped]
    return bool(updated) and not missing, f"updated {updated}, skipped (no signal) {skipped}, neither {missing}"


def retention_kept(step_labels: list[int | None], last_step: int, keep_steps: int) -> tuple[bool, str]:
    """What the ledger holds of the run after its last step: only the last keep_steps steps' rollouts
    (agl.retention.keep_steps; 0: none, -1: all)."""
    if keep_steps < 0:
        return True, f"{len(step_labels)} kept (keep_steps -1)"
    oldest = last_step - keep_steps + 1
    stale = [s for s in step_labels if s is None or s < oldest]
    return not stale, f"{len(step_labels)} left, {len(stale)} from steps before {oldest}"


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
    return ok


async def ledger_state(
    ledger: str, key: str, run_id: str, model_name: str
) -> tuple[list[int | None], list[Any], proxy_control_pb2.ProxyControl]:
    async with LedgerClient(ledger, key=key or None) as client:
        left = await client.list_rollouts(labels={"agl_run": run_id})
        labels = [r.metadata.labels.get("agl_step", "") for r in left]
        steps = [int(v) if v.isdigit() else None for v in labels]
        return steps, list(await client.list_models(model_name)), await client.get_proxy_control()


# A chat call that asks for tool choice "auto": vLLM answers 400 unless the replica was started with
# --enable-auto-tool-choice and a --tool-call-parser (agl.tool_calls); one token is enough to know.
_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


async def registered(ledger: str, key: str, model_name: str) -> dict[str, int]:
    """The model's registered endpoints and the weights version each is registered at."""
    async with LedgerClient(ledger, key=key or None) as client:
        return {e.endpoint.rstrip("/"): e.version for e in await client.list_models(model_name)}


async def ask_greedy(ledger: str, key: str, model_name: str, ids: Sequence[int]) -> dict[str, Any] | None:
    """Each registered replica's greedy continuation of `ids` with the weights version it is registered at before
    and after the call, {endpoint: {"greedy": ..., "versions": (before, after)}}; None until the launch has
    registered its replicas at the first version (it replaces what an earlier run of this data dir left)."""
    before = await registered(ledger, key, model_name)
    if not before or any(v != gpu_greedy.FIRST_VERSION for v in before.values()):
        return None
    async with httpx.AsyncClient(timeout=60) as http:
        answers = {e: {"greedy": await gpu_greedy.ask_greedy(http, e, model_name, ids)} for e in before}
    after = await registered(ledger, key, model_name)
    for endpoint, answer in answers.items():
        answer["versions"] = (before[endpoint], after.get(endpoint))
    return answers


async def ask_replicas(ledger: str, key: str, model_name: str) -> dict[str, Any]:
    """Each registered replica's GET /v1/models (its parsed body, or why it did not answer) and the status and text
    of a chat call with tool choice "auto", as {endpoint: {"models": ..., "tools": (status, text)}}."""
    call = {"model": model_name, "messages": [{"role": "user", "content": "1+1?"}], "max_tokens": 1}
    call |= {"tools": [_TOOL], "tool_choice": "auto"}
    answers: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for endpoint in await registered(ledger, key, model_name):
            answer: dict[str, Any] = {}
            try:
                got = await http.get(f"{endpoint}/models")
                answer["models"] = got.json() if got.is_success else f"HTTP {got.status_code}"
                posted = await http.post(f"{endpoint}/chat/completions", json=call)
                answer["tools"] = (posted.status_code, posted.text[:300])
            except (httpx.HTTPError, ValueError) as exc:
                answer.setdefault("models", f"{type(exc).__name__}: {exc}")
                answer["tools"] = (0, f"{type(exc).__name__}: {exc}")
            answers[endpoint] = answer
    return answers


class Watch:
    """Beside a launch of the trainer, while `follow` reads its records: with `greedy`, asks the replicas for a
    greedy continuation as soon as they are registered (the launch's first weights); asks them their served model
    once the launch's first step is on record (its replicas awake, serving the next step); with `kill_after`, kills
    the trainer's process group once that step is on record and checkpointed (as tests/trainer/faults.py's
    kill_when)."""

    def __init__(
        self,
        proc: Any,
        records: list[dict[str, Any]],
        ask: Callable[[], dict[str, Any]],
        checkpoints: Path,
        kill_after: int = 0,
        greedy: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.proc, self.records, self.ask = proc, records, ask
        self.checkpoints, self.kill_after, self.greedy = checkpoints, kill_after, greedy
        self.models: dict[str, Any] | None = None
        self.greedy_answers: dict[str, Any] | None = None
        self.awake_gib: float | None = None
        self.killed = False

    def run(self) -> None:
        polled = 0.0
        while self.proc.poll() is None:
            # Once the replicas are registered (after the launch's first weight sync), before any update.
            if self.greedy and self.greedy_answers is None and time.monotonic() - polled > 0.5:
                polled = time.monotonic()
                try:
                    self.greedy_answers = self.greedy()
                except Exception as exc:  # the check prints it
                    self.greedy_answers = {"ledger": {"greedy": {"error": f"{type(exc).__name__}: {exc}"}}}
            if self.models is None and self.records:
                try:
                    self.awake_gib = gpu_checks.device_used_gib()  # the replicas woke after the step's update
                    self.models = self.ask()
                except Exception as exc:  # the check prints it
                    said = f"{type(exc).__name__}: {exc}"
                    self.models = {"ledger": {"models": said, "tools": (0, said)}}
            # verl writes its tracker once a checkpoint is whole; the run's folder is new, so any is this step's.
            on_record = self.kill_after in gpu_checks.training_steps(self.records)
            if self.kill_after and on_record and (self.checkpoints / "latest_checkpointed_iteration.txt").exists():
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.killed = True
                return
            time.sleep(0.1)


def launch(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    metrics: Path,
    total: int,
    ask: Callable[[], dict[str, Any]],
    **kw: Any,
) -> tuple[int, list[dict[str, Any]], Watch]:
    """One launch of the trainer, followed to its end, with a Watch beside it."""
    records: list[dict[str, Any]] = []
    with session.trainer_process(argv, env, log) as proc:
        watch = Watch(proc, records, ask, **kw)
        thread = threading.Thread(target=watch.run, name="gpu-smoke-watch", daemon=True)
        thread.start()
        session.follow(proc, metrics, sys.stdout, records, total=total)
        thread.join(timeout=30)
        return proc.returncode, records, watch


def main() -> int:
    args = parse()
    versions = gpu_checks.toolchain()
    print("toolchain: " + ", ".join(f"{name} {value}" for name, value in versions.items()), flush=True)
    results = [check("a torch.compile'd function on the GPU equals eager", *gpu_checks.compiled_matches_eager("cuda"))]
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    task_args = argparse.Namespace(train_tasks=64, val_tasks=8, max_operand=19)
    train_file, _, train = demo_train.prepare_tasks(data_dir, task_args)
    model = args.model or demo_train.prepare_model(
        data_dir / "models",
        train,
        100,
        sys.stdout,
        held_out=demo_train.start_held_out(task_args, demo_train.AGENTS["math"]),
        refuse=False,
    )
    run_id = f"gpu-smoke-{uuid.uuid4().hex[:6]}"
    specs = local_stack.load_compose({}, [])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller")}
    plans = local_stack.localize(specs, data_dir, {"controller": {"AGL_CONTROLLER_LOG_DIR": str(data_dir / "agents")}})
    logs = data_dir / "logs"
    kill_after = KILL_AFTER if args.resume and args.steps > KILL_AFTER else 0
    with local_stack.run_stack(plans, local_stack.start_order(specs), logs) as running:
        ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
        key = specs["ledger"].env.get("AGL_KEY", "")
        model_name = specs["proxy"].env["AGL_MODEL_NAME"]
        state = data_dir / "runs" / run_id
        state.mkdir(parents=True, exist_ok=True)
        items = overrides(args, run_id, ledger, key, model, train_file, save=bool(kill_after))
        argv = [sys.executable, "-m", "services.trainer", *items]
        env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(state / "metrics.jsonl")})
        print(f"run {run_id}: trainer log {state / 'trainer.log'}", flush=True)

        greedy_ids = gpu_greedy.prompt_ids(model)

        def ask() -> dict[str, Any]:
            return asyncio.run(ask_replicas(ledger, key, model_name))

        def greedy() -> dict[str, Any] | None:
            return asyncio.run(ask_greedy(ledger, key, model_name, greedy_ids))

        run = functools.partial(launch, argv, env, metrics=state / "metrics.jsonl", total=args.steps, ask=ask)
        first: list[dict[str, Any]] = []
        models: dict[str, Any] | None = None
        greedy_answers: dict[str, Any] | None = None
        awake_gib: float | None = None
        if kill_after:
            _, first, killer = run(
                log=state / "trainer-killed.log",
                checkpoints=state / "checkpoints",
                kill_after=kill_after,
                greedy=greedy,
            )
            greedy_answers = killer.greedy_answers
            print(f"killed the trainer's process group after step {kill_after}: {killer.killed}; again", flush=True)
            models, awake_gib = killer.models, killer.awake_gib
            # Out of the next launch's way: `follow` reads the file from its start, before verl starts it anew.
            if (state / "metrics.jsonl").exists():
                (state / "metrics.jsonl").rename(state / "metrics-killed.jsonl")
        # Only the first launch's replicas start from the model directory (a resumed one from its checkpoint).
        more = {} if kill_after else {"greedy": greedy}
        code, records, watch = run(log=state / "trainer.log", checkpoints=state / "checkpoints", **more)
        greedy_answers = greedy_answers if kill_after else watch.greedy_answers
        # The last launch's replicas may be gone before they are asked (its first record is its last step).
        models = models or watch.models
        awake_gib = awake_gib if kill_after else watch.awake_gib
        left, endpoints, control = asyncio.run(ledger_state(ledger, key, run_id, model_name))
    # The trainer and its replicas are gone: the GPU is transformers' now.
    hf, margins = gpu_greedy.hf_greedy(model, greedy_ids)
    print(f"greedy: prompt {gpu_greedy.PROMPT!r}, Hugging Face generate {hf}", flush=True)
    served = {endpoint: answer["models"] for endpoint, answer in (models or {}).items()}
    tools = {endpoint: answer["tools"] for endpoint, answer in (models or {}).items()}
    steps = {r["step"]: r["data"] for r in [*first, *records] if "training/global_step" in r["data"]}
    trained, trained_detail = steps_trained_or_skipped(steps, args.steps)
    kept, kept_detail = retention_kept(left, args.steps, KEEP_STEPS)
    print(gpu_checks.timing_table(steps), flush=True)
    results += [
        check("trainer exit code", code == 0, str(code)),
        check("every step updated or skipped for no signal, one updated", trained, trained_detail),
        check("log-prob gap engine/actor under the limits on every updated step", *gpu_checks.gaps_under(steps)),
        check("proxies paused and drained around every weight update", *gpu_checks.drained_every_step(steps)),
        check("replicas serve the routed model name", *gpu_checks.served_names(served, model_name)),
        check("replicas parse tool calls (tool choice auto accepted)", *gpu_checks.auto_tools(tools)),
        check(
            "replicas' greedy output after the first weight sync equals Hugging Face generate",
            *gpu_greedy.replicas_agree(greedy_answers or {}, hf, margins),
        ),
        # The replicas serve the last step's update (model_version = the step whose update they loaded).
        check(
            "endpoints registered at the last step", bool(endpoints) and max(e.version for e in endpoints) == args.steps
        ),
        check("consumed rollouts beyond the retention deleted", kept, kept_detail),
        check("proxies not paused at the end", *gpu_checks.not_paused(control)),
    ]
    # The run's own folder: these logs hold its launches only.
    log = (state / "trainer.log").read_text(errors="replace")
    earlier = (state / "trainer-killed.log").read_text(errors="replace") if kill_after else ""
    slept = gpu_checks.slept_every_step(earlier + log, len(steps))
    results.append(check("replicas slept before every update, freeing GPU memory", *slept))
    parsed = gpu_checks.tool_parser_logged(earlier + log, TOOL_PARSER, model_name)
    results.append(check(f"replica servers started with the tool parser {TOOL_PARSER} and the routed name", *parsed))
    # The first launch's log holds the first sleep, the one whose wake was measured.
    woke = gpu_checks.woke_back(earlier or log, awake_gib)
    results.append(check("GPU memory before and after the first sleep and wake; the wake took it back", *woke))
    if kill_after:
        results.append(
            check("killed after a step, resumed", *gpu_checks.resumed(first, records, kill_after, args.steps, log))
        )
    for n, data in sorted(steps.items()):
        gap = {k: data[k] for k in data if "probs_diff" in k or "logprob_diff" in k}
        print(f"step {n}: reward {data.get('agl/reward/mean')}  log-prob gaps {json.dumps(gap)}")
    if code != 0:
        print(log[-4000:])
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
