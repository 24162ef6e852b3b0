"""Real ledger, stand-in engine and proxy on loopback for the fuzz suite; totals printed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxy.conftest import KEY, Http, register, run_proxy, run_standin
from tests.support.procs import ServiceProcess, start_ledger

from . import settings, tally

FUZZ_KEY = KEY


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    store = Path(tmp_path_factory.mktemp("fuzz-ledger")) / "ledger.db"
    with start_ledger(store=f"sqlite:{store}", key=FUZZ_KEY) as process:
        yield process


@pytest.fixture(scope="module")
def engine(ledger: ServiceProcess) -> Iterator[Http]:
    with run_standin() as standin:
        register(ledger.address, standin)
        yield standin


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    with run_proxy(ledger.address) as process:
        yield process


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    rows = tally.lines()
    if rows:
        terminalreporter.section(f"fuzz totals (hypothesis profile {settings.PROFILE})")
        for row in rows:
            terminalreporter.write_line(row)
