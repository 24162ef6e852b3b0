"""v1.0's literal env_map values: a value that is not a path into the rollout is passed through as it is."""

from __future__ import annotations

import pytest

from services.controller.core.agent_env import resolve_env_map
from services.controller.core.outcome import ConfigError

CONTEXT = {"input": {"question": "q?", "n": 3}, "rollout_id": "ro-1", "attempt_id": "at-1", "is_train": True}


def test_values_outside_the_rollout_are_literals() -> None:
    env = resolve_env_map(
        {"MODE": "fast", "URL": "http://x/y.z", "EMPTY": "", "DOTTED": "inputs.question", "NOPE": "nope"}, CONTEXT
    )
    assert env == {"MODE": "fast", "URL": "http://x/y.z", "EMPTY": "", "DOTTED": "inputs.question", "NOPE": "nope"}


def test_paths_still_resolve_beside_literals() -> None:
    env = resolve_env_map({"Q": "input.question", "N": "input.n", "ID": "rollout_id", "MODE": "fast"}, CONTEXT)
    assert env == {"Q": "q?", "N": "3", "ID": "ro-1", "MODE": "fast"}


def test_a_path_into_the_input_that_does_not_resolve_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match=r"input\.missing"):
        resolve_env_map({"V": "input.missing"}, CONTEXT)
