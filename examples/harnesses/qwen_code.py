"""Qwen Code (`@qwen-code/qwen-code`, `qwen` headless) as an AGL rollout, unmodified.

    agl try --command "python3 -m examples.harnesses.qwen_code" --data examples/data/calc.jsonl \\
        --env-map AGL_TASK_QUESTION=input.question --env-map AGL_TASK_ANSWER=input.answer

Qwen Code speaks OpenAI chat completions with its `openai` auth type: OPENAI_BASE_URL is the rollout's base URL
(it appends `/chat/completions`), OPENAI_API_KEY the rollout's key, OPENAI_MODEL any name (the proxy routes the
call to the run's policy).

Turned off (its settings.json in the private HOME): telemetry, usage statistics, the auto-update check. Tools run
without asking (--approval-mode yolo: there is nobody to ask), in the workspace.
"""

from __future__ import annotations

import json

from .harness_rollout import Harness, Outcome, Places, Rollout, main

MAX_TURNS = 8
SETTINGS = {
    "telemetry": {"enabled": False},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False},
}


def prepare(rollout: Rollout, places: Places) -> tuple[list[str], dict[str, str]]:
    settings = places.home / ".qwen"
    settings.mkdir()
    (settings / "settings.json").write_text(json.dumps(SETTINGS, indent=2))
    env = {
        "OPENAI_BASE_URL": rollout.base_url,
        "OPENAI_API_KEY": rollout.key or "agl-no-key",
        "OPENAI_MODEL": "agl-policy",
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    }
    arguments = ["--auth-type", "openai", "--output-format", "json", "--approval-mode", "yolo"]
    arguments += ["--max-session-turns", str(MAX_TURNS), rollout.question]
    return arguments, env


def outcome(stdout: str, stderr: str = "") -> Outcome:
    """From what `--output-format json` prints: on stdout a JSON list of messages whose `result` entry holds the
    usage, the final text and `is_error` (with `error.message` after a failure), and on stderr an `{"error": ...}`
    object after a failure."""
    tokens, text, error = 0, "", ""
    for document in [*_json_documents(stdout), *_json_documents(stderr)]:
        if isinstance(document, list):
            for message in document:
                if isinstance(message, dict) and message.get("type") == "result":
                    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
                    tokens = usage.get("output_tokens") if isinstance(usage.get("output_tokens"), int) else 0
                    text = message.get("result") if isinstance(message.get("result"), str) else ""
                    failure = message.get("error") if isinstance(message.get("error"), dict) else {}
                    error = str(failure.get("message") or text) if message.get("is_error") else ""
        elif isinstance(document, dict) and isinstance(document.get("error"), dict):
            error = str(document["error"].get("message", ""))
    return Outcome(tokens, text, error)


def _json_documents(stdout: str) -> list[object]:
    """The JSON values printed one after another on stdout (each starting a line), other lines skipped."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(stdout):
        if stdout[at] in "[{" and (at == 0 or stdout[at - 1] == "\n"):
            try:
                value, at = decoder.raw_decode(stdout, at)
            except ValueError:
                at += 1
                continue
            found.append(value)
            continue
        at += 1
    return found


HARNESS = Harness(name="qwen-code", program="qwen", prepare=prepare, outcome=outcome)

if __name__ == "__main__":
    main(HARNESS)
