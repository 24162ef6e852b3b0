"""Fixtures for ledger tests: one real ledger per store kind for the session, raw async stubs per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2_grpc
from services.ledger.ledger import Ledger
from services.ledger.memory_store import MemoryStore
from services.ledger.sqlite_store import SqliteStore
from tests.support.procs import ServiceProcess, start_ledger

STORES = ("memory", "sqlite")


def store_arg(kind: str, directory: Path) -> str:
    return "memory" if kind == "memory" else f"sqlite:{directory / 'ledger.db'}"


@pytest.fixture(scope="session", params=STORES)
def ledger_proc(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A ledger shared by the tests of one store kind; tests isolate themselves with unique ids and labels."""
    directory = tmp_path_factory.mktemp(f"ledger-{request.param}")
    with start_ledger(store=store_arg(request.param, directory), log_dir=directory) as proc:
        yield proc


@pytest.fixture
async def stub(ledger_proc: ServiceProcess) -> AsyncIterator[ledger_service_pb2_grpc.LedgerServiceStub]:
    async with grpc.aio.insecure_channel(ledger_proc.address) as channel:
        yield ledger_service_pb2_grpc.LedgerServiceStub(channel)


@pytest.fixture
def uid() -> str:
    """A unique prefix for the ids and labels of one test."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(params=["memory", "sqlite"])
async def core(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    """The ledger's pure core in-process, over each store."""
    store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "l.db")
    ledger = Ledger(store)
    ledger.load()
    yield ledger
    await ledger.close()
