"""Fixtures of the trainer tests: one real ledger per module; every test uses its own run id."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.support.procs import ServiceProcess, start_ledger

_RUNS = itertools.count()


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(store="memory") as service:
        yield service


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    return f"t{next(_RUNS)}-{request.node.name[:24].replace('_', '-')}"
