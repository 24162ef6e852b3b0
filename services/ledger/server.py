"""Run the ledger: store, core, gRPC server (ledger, health, reflection), metrics, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.ops_http import OpsServer, metrics_only

from .auth import BearerAuthInterceptor
from .config import LedgerConfig
from .connection_limits import server_options
from .health import StoreHealth
from .ledger import Ledger
from .memory_store import MemoryStore
from .metrics import build_registry
from .servicer import SERVICE, LedgerServicer
from .sqlite_store import SqliteStore
from .store import Store

log = logging.getLogger(__name__)


def open_store(config: LedgerConfig, on_failure: object = None) -> Store:
    path = config.sqlite_path
    return MemoryStore() if path is None else SqliteStore(path, on_failure=on_failure)  # type: ignore[arg-type]


async def serve(config: LedgerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    exit_code = 0

    health_servicer = health.aio.HealthServicer()
    store_health: StoreHealth | None = None

    def store_failed(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 1
        if store_health is not None:
            store_health.store_failed()
        stop.set()

    store = open_store(config, store_failed)
    max_bytes = config.max_message_mb * 1024 * 1024
    # A page of events or rollouts is cut by bytes too, with room left for the rest of the message.
    ledger = Ledger(
        store,
        ring_size=config.ring_size,
        watch_buffer=config.watch_buffer,
        page_bytes=max_bytes * 15 // 16,
        quotas=config.quotas,
    )
    ledger.load()

    server = grpc.aio.server(
        interceptors=[BearerAuthInterceptor(config.key)] if config.key else None,
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
            *server_options(config),
        ],
    )
    servicer = LedgerServicer(ledger)
    servicer.register(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE.full_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(config.address)
    await server.start()
    store_health = StoreHealth(health_servicer, store, [SERVICE.full_name], stall_s=config.store_stall_seconds)
    await store_health.start()

    metrics_server = None
    metrics_note = "off"
    if config.metrics_port:
        registry = build_registry(ledger)
        handler = metrics_only(registry, "ledger")
        metrics_server = OpsServer(config.host, config.metrics_port, handler, name="ledger-metrics").start()
        metrics_note = f"http://{config.host}:{metrics_server.server_port}/metrics"
    else:
        build_registry(ledger)  # still wires the commit observer hook; harmless without an endpoint

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "ledger listening on %s:%d (store=%s, auth=%s, max message %d MiB, per rollout at most %d events and %d MiB,"
        " at most %d MiB an event, metrics=%s)",
        config.host, port, store.description, config.auth_mode, config.max_message_mb, config.max_rollout_events,
        config.max_rollout_mb, config.max_event_mb, metrics_note,
    )  # fmt: skip

    await stop.wait()
    log.info("ledger shutting down: refusing new calls, finishing in-flight ones (grace %.1fs)", config.grace_seconds)
    await store_health.stop()
    await health_servicer.enter_graceful_shutdown()
    servicer.close_streams()
    await server.stop(config.grace_seconds)
    await ledger.close()
    if metrics_server is not None:
        metrics_server.shutdown()
    log.info("ledger stopped (revision %d, %d events appended this run)", ledger.revision, ledger.events_appended)
    return exit_code
