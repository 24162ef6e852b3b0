"""Claude Code (`@anthropic-ai/claude-code`, `claude -p`) as an AGL rollout, unmodified.

    agl try --command "python3 -m examples.harnesses.claude_code" --data examples/data/calc.jsonl \\
        --env-map AGL_TASK_QUESTION=input.question --env-map AGL_TASK_ANSWER=input.answer

Claude Code speaks the Anthropic Messages API: ANTHROPIC_BASE_URL is the rollout's base URL without its `/v1`
(Claude Code appends `/v1/messages`, the proxy serves `…/openai/v1/messages`), and the rollout's key goes as
ANTHROPIC_API_KEY (the `x-api-key` header, which the proxy accepts as the bearer key; in print mode Claude Code
uses it without asking and never looks for a login). Whatever model name it sends, the proxy routes the call to
the run's policy; its side tasks go under its small model's name (a haiku one), which a run's role map can label and
keep out of training (`agl train --frozen-role '*haiku*=policy'`, docs/training/roles.md).

Turned off (its documented variables): telemetry, error reporting, the auto-updater and every other request that
is not a model call (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC), the feedback survey. Sessions are not written
(--no-session-persistence). Permissions: the workspace tools listed in ALLOWED_TOOLS run without asking, anything
else that would ask is refused (--permission-mode dontAsk): there is nobody to ask, and bypassPermissions is
refused to root.
"""

from __future__ import annotations

import json

from .harness_rollout import Harness, Outcome, Places, Rollout, main

MAX_TURNS = 8
ALLOWED_TOOLS = "Bash,Read,Write,Edit,Glob,Grep"
_QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
}


def prepare(rollout: Rollout, places: Places) -> tuple[list[str], dict[str, str]]:
    env = {
        "ANTHROPIC_BASE_URL": rollout.base_url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": rollout.key or "agl-no-key",
        **_QUIET,
    }
    arguments = ["--print", "--output-format", "json", "--no-session-persistence", "--max-turns", str(MAX_TURNS)]
    arguments += ["--permission-mode", "dontAsk", "--allowedTools", ALLOWED_TOOLS, "--", rollout.question]
    return arguments, env


def outcome(stdout: str, stderr: str = "") -> Outcome:
    """From the `result` object that `--output-format json` prints last: its usage, `result` and `is_error`."""
    result = _last_json_object(stdout)
    if result is None:
        return Outcome(0, "", "no JSON result on its output")
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
    tokens = usage.get("output_tokens")
    text = result.get("result") if isinstance(result.get("result"), str) else ""
    error = text if result.get("is_error") else ""
    return Outcome(tokens if isinstance(tokens, int) else 0, text, error)


def _last_json_object(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


HARNESS = Harness(name="claude-code", program="claude", prepare=prepare, outcome=outcome)

if __name__ == "__main__":
    main(HARNESS)
