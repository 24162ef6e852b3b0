"""Fixtures shared by every test folder: `cpu_engine` (one real CPU vLLM engine per session)."""

from __future__ import annotations

pytest_plugins = ["tests.support.engine"]
