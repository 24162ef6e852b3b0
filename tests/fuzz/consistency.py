"""The ledger's stored state checked after a fuzz run, through its public RPCs only."""

from __future__ import annotations

import grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, rollout_pb2
from tests.support.procs import ServiceProcess, wait_grpc_ready

QUEUING, RUNNING = rollout_pb2.ROLLOUT_STATE_QUEUING, rollout_pb2.ROLLOUT_STATE_RUNNING
TERMINAL = {rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED}
_EVENT_CHECKS = 300


def check_ledger(ledger: ServiceProcess, key: str) -> dict[str, int]:
    """Asserts: alive and SERVING; every rollout in a known state (running ones with an attempt); the terminal log
    in cursor order, holding only terminal rollouts; each rollout's events its own, in strictly increasing order."""
    assert ledger.alive(), ledger.log_text()[-4000:]
    wait_grpc_ready(ledger.address, timeout_s=10)
    metadata = (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(ledger.address) as channel:
        stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
        rollouts = []
        token = ""
        while True:
            page = stub.ListRollouts(pb.ListRolloutsRequest(page_size=500, page_token=token), metadata=metadata)
            rollouts.extend(page.rollouts)
            token = page.next_page_token
            if not token:
                break
        states = {}
        for rollout in rollouts:
            state = rollout.status.state
            assert state in (QUEUING, RUNNING, *TERMINAL), rollout
            if state == RUNNING:
                assert rollout.status.attempt_id, rollout
            states[rollout.rollout_id] = state
        cursor, last, terminal = 0, 0, 0
        while True:
            page = stub.ListTerminalRollouts(
                pb.ListTerminalRolloutsRequest(after_cursor=cursor, page_size=500), metadata=metadata
            )
            for entry in page.entries:
                assert entry.cursor > last, (entry.cursor, last)
                last = entry.cursor
                assert entry.rollout.status.state in TERMINAL, entry.rollout
                if entry.rollout.rollout_id in states:
                    assert states[entry.rollout.rollout_id] in TERMINAL, entry.rollout
                terminal += 1
            if not page.entries or page.next_cursor <= cursor:
                break
            cursor = page.next_cursor
        events = 0
        for rollout in rollouts[:_EVENT_CHECKS]:
            reply = stub.ListEvents(
                pb.ListEventsRequest(rollout_id=rollout.rollout_id, attempt_id="*", page_size=1000), metadata=metadata
            )
            sequences = [event.sequence for event in reply.events]
            assert sequences == sorted(set(sequences)), (rollout.rollout_id, sequences)
            assert all(event.rollout_id == rollout.rollout_id for event in reply.events)
            events += len(reply.events)
    return {"rollouts": len(rollouts), "terminal": terminal, "events": events}
