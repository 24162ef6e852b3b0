"""Fixtures shared by every test folder: `cpu_engine` (one real CPU vLLM engine per session), `podman`; the
per-test times CI reads (AGL_TEST_TIMES); how the tests are shared between `make test`'s workers."""

from __future__ import annotations

pytest_plugins = [
    "tests.support.engine",
    "tests.support.containers",
    "tests.support.test_times",
    "tests.support.scheduling",
]
