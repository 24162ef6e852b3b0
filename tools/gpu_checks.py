"""The checks of tools/gpu_smoke.py that only a GPU run can answer, as pure functions over what the run left: the
trainer's per-step metrics (verl's file logger records), the ledger's proxy control, the replicas' /v1/models
answers, the two launches of a killed and resumed run, and the toolchain of the machine. Each returns (ok, detail)
and is tested on CPU with a correct and a wrong input (tests/trainer/test_gpu_smoke_checks.py); none has yet run
against a real GPU run.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services._gen.agl.v1 import proxy_control_pb2
from services.cli import render

Steps = Mapping[int, Mapping[str, Any]]

# Mean gaps on the trained tokens between the engine's sampling log-probs and the actor's recomputation on the same
# weights. agl/push/logprob_diff_mean is in nats; the limit is the logprob_gap guardrail's warning level
# (services/trainer/data/guardrails.py). verl's training/rollout_probs_diff_mean is in probability.
GAP_LIMITS = {"agl/push/logprob_diff_mean": 0.05, "training/rollout_probs_diff_mean": 0.02}


def updated_steps(steps: Steps) -> list[int]:
    """The steps whose actor was updated (skipped ones, for no learning signal, have no actor metrics)."""
    return sorted(n for n, data in steps.items() if "actor/pg_loss" in data)


def gaps_under(steps: Steps, limits: Mapping[str, float] = GAP_LIMITS) -> tuple[bool, str]:
    """Every updated step has each gap metric, under its limit (a NaN, verl's value for no valid token, fails)."""
    updated = updated_steps(steps)
    bad = []
    for n in updated:
        for key, limit in limits.items():
            value = steps[n].get(key)
            if value is None or not float(value) <= limit:
                bad.append(f"step {n} {key}={value} (limit {limit})")
    if not updated:
        return False, "no step updated, so no gap was measured"
    return not bad, "; ".join(bad) or f"steps {updated} under {dict(limits)}"


def drained_every_step(steps: Steps) -> tuple[bool, str]:
    """Each training step paused and drained the proxies before its weight update (agl/proxy/drained == 1)."""
    training = sorted(n for n, data in steps.items() if "training/global_step" in data)
    seconds = {n: steps[n].get("agl/proxy/drain_s") for n in training}
    missing = [n for n in training if steps[n].get("agl/proxy/drained") != 1.0 or seconds[n] is None]
    detail = ", ".join(f"step {n} {s if s is None else f'{s:.2f}s'}" for n, s in seconds.items())
    return bool(training) and not missing, f"drain time {detail or 'none'}; not drained {missing}"


def timing_table(steps: Steps) -> str:
    """verl's and AGL's per-phase times (timing_s/*), a row per phase and a column per step."""
    numbers = sorted(steps)
    phases = sorted({k for data in steps.values() for k in data if k.startswith("timing_s/")})
    rows = [
        (p.removeprefix("timing_s/"), *(f"{steps[n][p]:.2f}" if p in steps[n] else "-" for n in numbers))
        for p in phases
    ]
    return render.table(("PHASE (s)", *(f"step {n}" for n in numbers)), rows)


def not_paused(control: proxy_control_pb2.ProxyControl) -> tuple[bool, str]:
    """The proxies serve after the run: no pause left in the ledger (every later agent call would get 429)."""
    if control.paused:
        return False, f"paused by {control.owner or 'nobody'} ({control.reason}), generation {control.generation}"
    return True, f"serving, generation {control.generation}, {len(control.replicas)} live replicas"


def served_names(answers: Mapping[str, Any], model_name: str) -> tuple[bool, str]:
    """Each replica's GET /v1/models (the parsed body, or the error text) serves exactly the routed model name."""
    if not answers:
        return False, "no replica answered"
    lines, ok = [], True
    for endpoint, body in sorted(answers.items()):
        ids = [m.get("id") for m in body.get("data", [])] if isinstance(body, dict) else []
        ok = ok and ids == [model_name]
        lines.append(f"{endpoint} serves {ids if ids else body}")
    return ok, "; ".join(lines)


def auto_tools(answers: Mapping[str, tuple[int, str]]) -> tuple[bool, str]:
    """Each replica accepted a chat call with tool choice "auto" (HTTP status, text): vLLM refuses it with 400 unless
    started with --enable-auto-tool-choice and a --tool-call-parser."""
    if not answers:
        return False, "no replica answered"
    refused = {endpoint: f"{status} {text}" for endpoint, (status, text) in sorted(answers.items()) if status != 200}
    return not refused, "; ".join(f"{e}: {said}" for e, said in refused.items()) or f"{len(answers)} accepted"


def training_steps(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """The steps a launch trained, in order (a launch's step-0, or resumed step-N, weight sync record has no
    training/global_step)."""
    return [int(r["step"]) for r in records if "training/global_step" in r.get("data", {})]


def resumed(
    first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]], killed_after: int, total: int, log: str
) -> tuple[bool, str]:
    """A run killed after step `killed_after` was checkpointed, started again with the same command: the second
    launch rewound to that checkpoint and trained only the later steps, so each step is on record once."""
    before, after = training_steps(first), training_steps(second)
    every = before + after
    twice = sorted({n for n in every if every.count(n) > 1})
    line = f"rewound to the checkpoint of step {killed_after}"
    ok = before[-1:] == [killed_after] and after == list(range(killed_after + 1, total + 1)) and not twice
    ok = ok and line in log
    said = "says" if line in log else "does not say"
    return ok, f"first launch trained {before}, second {after}; twice {twice}; its log {said} '{line}'"


# vLLM's worker logs each sleep (v1/worker/gpu_worker.py); Ray forwards it to the trainer's log.
_SLEPT = re.compile(r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use")


def slept_every_step(log: str, trained: int) -> tuple[bool, str]:
    """The colocated replicas slept before each of the `trained` weight updates, and each sleep freed GPU memory
    (vLLM's own measure: the device's free memory before and after; what waking takes back is not logged)."""
    sleeps = [(float(freed), float(used)) for freed, used in _SLEPT.findall(log)]
    detail = ", ".join(f"freed {freed:.2f} GiB ({used:.2f} GiB in use)" for freed, used in sleeps)
    ok = trained > 0 and len(sleeps) >= trained and all(freed > 0 for freed, _ in sleeps)
    return ok, f"{len(sleeps)} sleeps for {trained} steps: {detail or 'none logged'}"


def logged_flag(log: str, flag: str) -> list[str]:
    """The values of `--flag` in the `vllm serve` argument lists verl prints (pprint) as it starts a replica's server,
    one per start; Ray prefixes each forwarded line with its actor, between the flag and its value too."""
    return re.findall(rf"'--{re.escape(flag)}',\s*(?:\([^)\n]*\)\s*)?'([^']*)'", log)


def tool_parser_logged(log: str, parser: str, model_name: str) -> tuple[bool, str]:
    """Every replica server verl started (rank 0 prints its arguments) was given the routed model name, the tool
    choice "auto" and the expected tool-call parser (what the replicas' answers do not say)."""
    parsers, names = logged_flag(log, "tool-call-parser"), logged_flag(log, "served-model-name")
    auto = log.count("'--enable-auto-tool-choice'")
    ok = bool(parsers) and set(parsers) == {parser} and set(names) == {model_name} and auto >= len(parsers)
    return ok, f"servers started with --tool-call-parser {parsers}, --served-model-name {names}, auto {auto}"


def device_used_gib() -> float | None:
    """GPU memory in use on device 0, all processes (vLLM's own measure in its sleep line); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return (total - free) / 2**30


def woke_back(log: str, awake_gib: float | None) -> tuple[bool, str]:
    """GPU memory around the replicas' first sleep and wake: in use before the sleep and after it (vLLM's sleep
    line: freed, still in use), and after the wake (`awake_gib`, measured once the step is on record, the replicas
    awake for the next). The wake must take back at least half of what the sleep freed."""
    sleeps = [(float(freed), float(used)) for freed, used in _SLEPT.findall(log)]
    if not sleeps or awake_gib is None:
        return (
            False,
            f"{len(sleeps)} sleeps logged, memory after the wake {'not measured' if awake_gib is None else awake_gib}",
        )
    freed, asleep = sleeps[0]
    detail = f"in use before the sleep {asleep + freed:.2f} GiB, after it {asleep:.2f}, after the wake {awake_gib:.2f}"
    return awake_gib >= asleep + freed / 2, detail


def toolchain() -> dict[str, str]:
    """torch, CUDA, triton and the C compiler triton builds its launcher with (issue 28 row 3)."""
    import torch

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    compiler = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    found = "not found"
    if compiler:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
        found = f"{compiler}: {(done.stdout.splitlines() or ['?'])[0]}"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
    return {
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": version("triton"),
        "c compiler": found,
        "gpu": gpu,
    }


def _polynomial(x: Any) -> Any:
    return (x.sin() * x + x.square() / 3).cumsum(0)


def compiled_matches_eager(
    device: str = "cuda", backend: str = "inductor", fn: Callable[[Any], Any] = _polynomial
) -> tuple[bool, str]:
    """`fn` compiled by torch.compile on `device` (on CUDA with inductor: a triton kernel, built by the C compiler)
    gives what it gives eagerly. An unavailable device or a compile error is a failure with its reason."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return False, "no CUDA device is visible"
    x = torch.linspace(-2, 2, 1024, device=device)
    try:
        compiled = torch.compile(fn, backend=backend, fullgraph=True)(x)
    except Exception as exc:  # the reason is the check's detail
        return False, f"torch.compile ({backend}) on {device} failed: {type(exc).__name__}: {str(exc)[:300]}"
    eager = fn(x)
    gap = float((compiled - eager).abs().max())
    return bool(torch.allclose(compiled, eager, atol=1e-4, rtol=1e-4)), f"{backend} on {device}: max |diff| {gap:.2e}"
