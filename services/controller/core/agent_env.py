"""The environment an agent is launched with: the §3 variables and the rollout's env_map fields.

An env_map value is a path into the rollout when its first dotted part names a field of the template context
(`input`, `input.question`, `rollout_id`, ...); any other value is passed through as a literal, as Agent Lightning
v1.0 does with values that do not start with `input.` (`{"MODE": "fast"}` sets MODE=fast). A path that does not
resolve is still an error naming the path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.client import agent_token

from .outcome import ConfigError

BASE_URL_VAR = "AGL_OPENAI_BASE_URL"
EVENT_URL_VAR = "AGL_EVENT_URL"
KEY_VAR = "AGL_KEY"
AGENT_VARS = (BASE_URL_VAR, EVENT_URL_VAR, KEY_VAR)
# Sent as the bearer key when the system runs without a key: the proxy then checks nothing.
NO_KEY = "agl-no-key"

_MISSING = object()


def agent_env(agent_url: str, rollout_id: str, attempt_id: str, is_train: bool, key: str | None) -> dict[str, str]:
    """The §3 variables. AGL_KEY is the per-rollout agent token, never the master key."""
    base = agent_url.rstrip("/")
    mode = "train" if is_train else "val"
    return {
        BASE_URL_VAR: f"{base}/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1",
        EVENT_URL_VAR: f"{base}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events",
        KEY_VAR: agent_token(key, rollout_id, attempt_id) if key else NO_KEY,
    }


def parse_input(input_json: str) -> Any:
    """The rollout input as a Python value; empty text means None."""
    if not input_json.strip():
        return None
    try:
        return json.loads(input_json)
    except ValueError as err:
        raise ConfigError(f"rollout input is not valid JSON: {err}") from err


def lookup_path(root: Mapping[str, Any], path: str) -> Any:
    """Follows a dotted path ("input.items.0.text"); list items by index. Raises ConfigError naming the path."""
    value: Any = root
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise ConfigError(f"env_map path {path!r} not found in the rollout (no {part!r})")
    return value


def is_path(value: str, context: Mapping[str, Any]) -> bool:
    """Whether an env_map value refers into the rollout (its first dotted part is a context field)."""
    return value.split(".", 1)[0] in context


def env_value(value: Any) -> str:
    """Strings as they are; anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def resolve_env_map(env_map: Mapping[str, str], context: Mapping[str, Any]) -> dict[str, str]:
    """Environment variables taken from the rollout (`context` holds at least `input`)."""
    env: dict[str, str] = {}
    for name in sorted(env_map):
        if not name or "=" in name or "\0" in name:
            raise ConfigError(f"env_map has an invalid variable name {name!r}")
        if name in AGENT_VARS:
            raise ConfigError(f"env_map may not set {name}: the controller sets it")
        value = env_map[name]
        env[name] = env_value(lookup_path(context, value)) if is_path(value, context) else value
    return env
