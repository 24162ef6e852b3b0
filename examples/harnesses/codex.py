"""Codex (`@openai/codex`, `codex exec`) as an AGL rollout, unmodified.

    agl try --command "python3 -m examples.harnesses.codex" --data examples/data/calc.jsonl \\
        --env-map AGL_TASK_QUESTION=input.question --env-map AGL_TASK_ANSWER=input.answer

Codex speaks the OpenAI Responses API only (it refuses `wire_api = "chat"`): its config.toml, written into the
private HOME's `.codex/`, declares a model provider whose base_url is the rollout's base URL (Codex appends
`/responses`) and whose key is read from AGL_KEY (env_key), and makes it the default. The model name is the
provider's; the proxy routes the call to the run's policy whatever it is.

Turned off (config keys): analytics, feedback, the update check; the built-in web search (the engine cannot run
it; the proxy would drop it from each request with a warning event). Sessions are not written (--ephemeral).
Sub-agents stay on, as Codex ships: a sub-agent's calls are the policy's too, recorded in the same rollout as a
conversation of their own (segment rows for the trainer); `--disable multi_agent` in exec's arguments turns them
off. Shell commands run in Codex's workspace-write sandbox (no network) and are never asked about (exec's approval
policy).
"""

from __future__ import annotations

import json

from .harness_rollout import Harness, Outcome, Places, Rollout, main

MODEL = "agl-policy"  # any name: the proxy routes every call to the run's policy


def config_toml(rollout: Rollout) -> str:
    return "\n".join(
        [
            f"model = {json.dumps(MODEL)}",
            'model_provider = "agl"',
            "check_for_update_on_startup = false",
            'web_search = "disabled"',
            "",
            "[model_providers.agl]",
            'name = "AGL"',
            f"base_url = {json.dumps(rollout.base_url)}",  # a JSON string is a TOML basic string
            'env_key = "AGL_KEY"',
            'wire_api = "responses"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
        ]
    )


def prepare(rollout: Rollout, places: Places) -> tuple[list[str], dict[str, str]]:
    codex_home = places.home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(config_toml(rollout))
    env = {"CODEX_HOME": str(codex_home), "AGL_KEY": rollout.key or "agl-no-key"}
    arguments = ["exec", "--json", "--ephemeral", "--skip-git-repo-check", "--sandbox", "workspace-write"]
    return [*arguments, "--", rollout.question], env


def outcome(stdout: str, stderr: str = "") -> Outcome:
    """From the JSONL events of `--json`: output tokens of each `turn.completed`, the last `agent_message`, and the
    error of a `turn.failed` or `error` event."""
    tokens, text, error = 0, "", ""
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "turn.completed":
            usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
            tokens += usage.get("output_tokens", 0) if isinstance(usage.get("output_tokens"), int) else 0
        elif kind == "item.completed" and isinstance(event.get("item"), dict):
            item = event["item"]
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                text = item["text"]
        elif kind == "turn.failed" and isinstance(event.get("error"), dict):
            error = str(event["error"].get("message", ""))
        elif kind == "error" and not error:
            error = str(event.get("message", ""))
    return Outcome(tokens, text, error)


HARNESS = Harness(name="codex", program="codex", prepare=prepare, outcome=outcome)

if __name__ == "__main__":
    main(HARNESS)
