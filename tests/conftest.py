"""Fixtures shared by every test folder: `cpu_engine` (one real CPU vLLM engine per session), `podman`."""

from __future__ import annotations

pytest_plugins = ["tests.support.engine", "tests.support.containers"]
