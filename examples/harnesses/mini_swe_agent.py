"""mini-swe-agent (PyPI `mini-swe-agent`, its `mini` CLI) as an AGL rollout, unmodified.

    agl try --command "python3 -m examples.harnesses.mini_swe_agent" --data examples/data/calc.jsonl \\
        --env-map AGL_TASK_QUESTION=input.question --env-map AGL_TASK_ANSWER=input.answer

mini-swe-agent reaches models through litellm, and speaks OpenAI chat completions to an `openai/...` model: the
config file the recipe writes into the private HOME names the model `openai/agl-policy` (the proxy routes any name
to the run's policy) with the rollout's base URL as litellm's `api_base` (litellm appends `/chat/completions`) and
the rollout's key in OPENAI_API_KEY. It is merged over the builtin `mini.yaml` (its prompts and its one `bash`
tool), as `mini -c mini.yaml -c FILE` merges them.

Turned off or fenced in: the first-run setup dialog (MSWEA_CONFIGURED); the global config folder and its `.env`
(MSWEA_GLOBAL_CONFIG_DIR, in the private HOME); cost tracking, which knows no price for the policy and would stop
the run (`cost_tracking: ignore_errors`, `cost_limit: 0`); litellm's download of its model price list at import
(LITELLM_LOCAL_MODEL_COST_MAP); the startup banner. Commands run without asking (yolo mode) in the workspace,
and the agent ends when it wants to, without asking either (`confirm_exit: false`). Steps are capped at MAX_TURNS.
mini-swe-agent's own retries of a failed model call (10, waiting 4 s doubling to 60 s) are kept: they outlast a
proxy paused for a weight update; MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT in the rollout's environment changes them.

It reports its run in its trajectory file (`-o`): every message, each answer with the engine's usage, and how it
exited (`info.exit_status`; the exception of a failed run in the last message).
"""

from __future__ import annotations

import json
from pathlib import Path

from .harness_rollout import Harness, Outcome, Places, Rollout, main

MAX_TURNS = 8
MODEL = "openai/agl-policy"  # litellm's provider/model: `openai/` speaks chat completions to api_base
TRAJECTORY = "trajectory.json"  # in the private HOME
# Where `make harnesses` installs it: a venv of its own (its litellm pins would fight AGL's).
INSTALLED_BIN = Path(__file__).resolve().parents[2] / ".venv-harness-py" / "bin"


def config(rollout: Rollout, places: Places) -> dict[str, object]:
    return {
        "model": {
            "model_name": MODEL,
            "model_kwargs": {"api_base": rollout.base_url, "drop_params": True},
            "cost_tracking": "ignore_errors",
        },
        "agent": {
            "mode": "yolo",
            "confirm_exit": False,
            "step_limit": MAX_TURNS,
            "cost_limit": 0,
        },
        "environment": {"cwd": str(places.workspace)},
    }


def prepare(rollout: Rollout, places: Places) -> tuple[list[str], dict[str, str]]:
    settings = places.home / "agl-mini.yaml"
    settings.write_text(json.dumps(config(rollout, places), indent=2))  # JSON is YAML
    env = {
        "OPENAI_API_KEY": rollout.key or "agl-no-key",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": str(places.home / ".config" / "mini-swe-agent"),
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_MODEL_NAME": MODEL,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    # -o: the CLI's own default output path would override one in the config file.
    arguments = ["-c", "mini.yaml", "-c", str(settings), "-o", str(places.home / TRAJECTORY)]
    return [*arguments, "--task", rollout.question], env


def outcome(report: str, stderr: str = "") -> Outcome:
    """From the trajectory file: output tokens summed over the answers' usage; the final text is the submission, or
    else the last answer's text; the error is the exception of a run that ended in one."""
    try:
        trajectory = json.loads(report) if report else {}
    except ValueError:
        trajectory = {}
    messages = trajectory.get("messages") if isinstance(trajectory, dict) else None
    messages = [m for m in messages or [] if isinstance(m, dict)]
    tokens, text = 0, ""
    for message in messages:
        if message.get("role") != "assistant":
            continue
        usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
        tokens += usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else 0
        text = message.get("content") if isinstance(message.get("content"), str) else text
    info = trajectory.get("info") if isinstance(trajectory, dict) else None
    info = info if isinstance(info, dict) else {}
    submission = info.get("submission")
    last = (messages[-1].get("extra") or {}) if messages else {}
    error = str(last.get("exception_str") or "")
    if not error and not messages:
        error = stderr.strip().splitlines()[-1] if stderr.strip() else "no trajectory written"
    return Outcome(tokens, submission if isinstance(submission, str) and submission.strip() else text, error)


HARNESS = Harness(
    name="mini-swe-agent",
    program="mini",
    prepare=prepare,
    outcome=outcome,
    report=TRAJECTORY,
    installed_bin=INSTALLED_BIN,
)

if __name__ == "__main__":
    main(HARNESS)
