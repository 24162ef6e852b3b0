"""Shared helpers of the deployment tests: where things are and what each service reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"


def config_env_names(module: str) -> set[str]:
    """AGL_* variable names a service's config.py reads (module like "services.proxy")."""
    path = REPO_ROOT / module.replace(".", "/") / "config.py"
    if not path.is_file():
        pytest.fail(f"{path.relative_to(REPO_ROOT)} does not exist: cannot check the variables it reads")
    return set(re.findall(r"[\"'](AGL_[A-Z0-9_]+)[\"']", path.read_text()))
