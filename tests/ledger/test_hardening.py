"""The adversarial probe of issue 17, re-run against a real ledger: each attack must now be refused cleanly."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services import role_map
from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, rollout_pb2
from tests.support.procs import start_ledger

from .support import RUNNING, SUCCEEDED, append, create, custom, expect_error, list_events, reward, spec, update


@pytest.mark.parametrize(
    "bad_id", ["c1:x", "a/b", "a?b", "a#b", "a%2Fb", "a b", "a\nb", "a\r\nInjected: 1", "nul\x00", "..", ".", "-x"]
)
async def test_rollout_ids_outside_the_safe_set_are_refused_naming_the_id(stub, bad_id: str) -> None:
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, create(stub, bad_id))
    assert repr(bad_id) in details and "rollout_id" in details


async def test_agent_lightning_and_trainer_id_shapes_are_accepted(stub, uid: str) -> None:
    ids = [f"{uid}0123456789abcdef0123456789", f"run-{uid}-s1-g0-r3", f"demo_{uid}-g0-1", f"{uid}.v2"]
    created = await create(stub, *ids)
    assert [r.rollout_id for r in created] == ids
    await update(stub, ids[0], RUNNING, attempt_id="0f" * 16)  # the controller's uuid-hex attempt ids


@pytest.mark.parametrize("bad_attempt", ["x:A", "a/b", "a\r\nInjected: 1", ".."])
async def test_attempt_ids_outside_the_safe_set_are_refused(stub, uid: str, bad_attempt: str) -> None:
    rid = f"{uid}-r"
    await create(stub, rid)
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, update(stub, rid, RUNNING, attempt_id=bad_attempt))
    assert repr(bad_attempt) in details


async def test_events_on_an_attempt_the_rollout_never_had_are_refused(stub, uid: str) -> None:
    rid = f"{uid}-r"
    await create(stub, rid)
    await update(stub, rid, RUNNING, attempt_id="a1")
    details = await expect_error(grpc.StatusCode.NOT_FOUND, append(stub, reward(rid, 1.0, attempt_id="bogus-att")))
    assert "bogus-att" in details and rid in details
    assert await list_events(stub, rid, attempt_id="*") == []  # nothing stored
    reply = await append(stub, reward(rid, 1.0, attempt_id="a1"), reward(rid, 2.0))
    assert list(reply.attempt_ids) == ["a1", "a1"]


async def test_deeply_nested_input_json_is_invalid_argument_not_unknown(stub, uid: str) -> None:
    for depth in (2_000, 100_000):
        deep = "[" * depth + "]" * depth
        request = pb.CreateRolloutsRequest(rollouts=[spec(f"{uid}-{depth}", input_json=deep)])
        details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.CreateRollouts(request))
        assert "input_json" in details and "nested" in details
    event = custom(f"{uid}-none", "[" * 5000 + "]" * 5000)
    await create(stub, f"{uid}-none")
    event.rollout_id = f"{uid}-none"
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, append(stub, event))


async def test_an_event_id_repeated_with_other_content_is_already_exists(stub, uid: str) -> None:
    rid = f"{uid}-r"
    await create(stub, rid)
    first = await append(stub, reward(rid, 1.0, event_id="e1"))
    again = await append(stub, reward(rid, 1.0, event_id="e1"))  # a retry: same content, same sequence
    assert list(again.sequences) == list(first.sequences) == [1]
    details = await expect_error(grpc.StatusCode.ALREADY_EXISTS, append(stub, reward(rid, 9.0, event_id="e1")))
    assert "e1" in details and rid in details
    assert [e.reward.value for e in await list_events(stub, rid)] == [1.0]


async def test_status_log_lines_cannot_be_forged(tmp_path) -> None:
    with start_ledger(log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, "r1")
            await update(stub, "r1", RUNNING, attempt_id="a1")
            await update(stub, "r1", SUCCEEDED, error_message="done\r\nInjected: 1\x00")
    text = led.log_text()
    assert "done\\x0d\\x0aInjected: 1\\x00" in text
    assert "\nInjected" not in text and "\x00" not in text


async def test_pages_are_cut_by_bytes_so_large_events_can_be_listed(tmp_path) -> None:
    big = "x" * (3 * 1024 * 1024)  # two of these exceed the 4 MiB message limit together
    with start_ledger(log_dir=tmp_path, extra_args=["--max-message-mb", "4"]) as led:
        options = [("grpc.max_receive_message_length", 8 * 1024 * 1024)]
        async with grpc.aio.insecure_channel(led.address, options=options) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            for i in range(2):
                await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec(f"r{i}", input_json=f'"{big}"')]))
            for i in range(2):
                await append(stub, custom("r0", f'"{big}{i}"'))
            first = await stub.ListEvents(pb.ListEventsRequest(rollout_id="r0"))
            assert [e.sequence for e in first.events] == [1] and first.next_page_token
            second = await stub.ListEvents(pb.ListEventsRequest(rollout_id="r0", page_token=first.next_page_token))
            assert [e.sequence for e in second.events] == [2] and not second.next_page_token
            page = await stub.ListRollouts(pb.ListRolloutsRequest())
            assert len(page.rollouts) == 1 and page.next_page_token
            rest = await stub.ListRollouts(pb.ListRolloutsRequest(page_token=page.next_page_token))
            assert [r.rollout_id for r in rest.rollouts] == ["r1"]
            for rid in ("r0", "r1"):
                await update(stub, rid, rollout_pb2.ROLLOUT_STATE_FAILED)
            terminal = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest())
            assert len(terminal.entries) == 1
            more = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(after_cursor=terminal.next_cursor))
            assert [e.rollout.rollout_id for e in more.entries] == ["r1"]


def _silent_connections(address: str, count: int) -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    sockets = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=5)
        sockets.append(s)
    return sockets


async def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (reading and dropping what it sends)."""
    loop = asyncio.get_running_loop()
    s.setblocking(False)
    deadline = loop.time() + seconds
    try:
        while (left := deadline - loop.time()) > 0:
            if not await asyncio.wait_for(loop.sock_recv(s, 65536), left):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


async def test_silent_connections_are_closed_and_capped(tmp_path) -> None:
    """Connections that never speak HTTP/2: above the cap they are refused at once, the others are closed at the
    handshake deadline, and a real client is served once they are gone."""
    args = ["--handshake-timeout", "2", "--max-connections", "20"]
    with start_ledger(log_dir=tmp_path, extra_args=args) as led:
        sockets = await asyncio.to_thread(_silent_connections, led.address, 60)
        try:
            refused = await asyncio.gather(*(_closed_within(s, 0.5) for s in sockets))
            assert 40 <= sum(refused) < 60, f"{sum(refused)} of 60 closed at once with a cap of 20"
            admitted = [s for s, gone in zip(sockets, refused, strict=True) if not gone]
            closed = await asyncio.gather(*(_closed_within(s, 5.0) for s in admitted))
            assert all(closed), f"{closed.count(False)} of {len(admitted)} silent connections still open"
        finally:
            for s in sockets:
                s.close()
        async with grpc.aio.insecure_channel(led.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_clients_pinging_too_often_are_told_to_go_away(tmp_path) -> None:
    """Keepalive is enforced: a client pinging every 100 ms without calls is disconnected (GOAWAY too_many_pings),
    while the default client (30 s pings) is served."""
    with start_ledger(log_dir=tmp_path, extra_args=["--min-ping-interval", "5"]) as led:
        options = [
            ("grpc.keepalive_time_ms", 100),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        async with grpc.aio.insecure_channel(led.address, options=options) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            watch = stub.WatchRollouts(pb.WatchRolloutsRequest())  # a long call, so the pings have a stream
            assert (await watch.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(watch.read(), 20)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_aged_and_idle_connections_are_recycled_without_cutting_watches(tmp_path) -> None:
    """Connection age and idle limits send GOAWAY: a watch in progress goes on, and new calls reconnect."""
    args = ["--max-connection-age", "1", "--max-connection-idle", "1"]
    with start_ledger(log_dir=tmp_path, extra_args=args) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            watch = stub.WatchRollouts(pb.WatchRolloutsRequest())
            assert (await watch.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED
            await asyncio.sleep(2.5)  # past the connection's age: no new calls on it, the watch continues
            await create(stub, "after-age")
            change = await asyncio.wait_for(watch.read(), 10)
            assert change.rollout.rollout_id == "after-age"
            watch.cancel()
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, "first")
            await asyncio.sleep(2.5)  # idle past the limit: the server closed the connection
            assert [r.rollout_id for r in await create(stub, "second")] == ["second"]


@pytest.mark.parametrize(
    "bad_map",
    [
        "not json",
        '{"roles": "gpt-4o=policy"}',
        '{"roles": [{"match": "gpt 4o", "policy": "policy", "frozen": false}], "unmapped": "policy"}',
        '{"roles": [], "unmapped": "sometimes"}',
    ],
)
async def test_a_role_map_label_that_cannot_route_is_refused_at_creation_naming_the_label(
    stub, uid: str, bad_map: str
) -> None:
    # Refused with the whole batch at the ledger, not call by call at the proxy once the agent runs.
    good = spec(f"{uid}-ok", {"agl_roles": role_map.from_settings(["gpt-4o=policy"], []).to_label()})
    bad = spec(f"{uid}-bad", {"agl_roles": bad_map})
    request = pb.CreateRolloutsRequest(rollouts=[good, bad])
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.CreateRollouts(request))
    assert "rollouts[1]" in details and "agl_roles" in details
    listed = await stub.ListRollouts(
        pb.ListRolloutsRequest(label_selector={"agl_roles": good.metadata.labels["agl_roles"]})
    )
    assert [r.rollout_id for r in listed.rollouts if r.rollout_id.startswith(uid)] == []  # nothing of the batch stored
    created = await create(stub, f"{uid}-ok", labels=dict(good.metadata.labels))
    assert created[0].metadata.labels["agl_roles"] == good.metadata.labels["agl_roles"]
