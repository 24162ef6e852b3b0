"""Fixtures for `agl` tests: one real ledger (with a key) per module, and the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import ServiceProcess, start_ledger

KEY = "cli-test-key"
AGL = Path(sys.executable).parent / "agl"


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_agl(*args: str, ledger: str, key: str | None = KEY, stdin: str | None = None, timeout: float = 60) -> Result:
    """Run the installed `agl` the way a user does, with the ledger address and key from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env["AGL_LEDGER_ADDR"] = ledger
    if key is not None:
        env["AGL_KEY"] = key
    proc = subprocess.run(
        [str(AGL), *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    directory = tmp_path_factory.mktemp("cli-ledger")
    with start_ledger(store=f"sqlite:{directory / 'ledger.db'}", key=KEY, log_dir=directory) as proc:
        yield proc


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:10]
