"""The pure core, in process: transition table, triplet view, terminal log, hub, stores, restore, wire helpers."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from services import wire
from services._gen.agl.v1 import event_pb2, ledger_service_pb2, proxy_control_pb2, rollout_pb2, run_pb2
from services.ledger import feeds, states
from services.ledger.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
)
from services.ledger.hub import Change, RolloutFilter, RolloutHub
from services.ledger.ledger import Ledger
from services.ledger.proxy_control import ProxyControlState
from services.ledger.sqlite_store import SqliteStore
from services.ledger.terminal_log import TerminalLog
from services.ledger.triplet import triplet_view

from .support import model_request, reward, spec

Q, R, S, F = states.QUEUING, states.RUNNING, states.SUCCEEDED, states.FAILED


def test_transition_table():
    legal = {(Q, R), (Q, F), (R, R), (R, S), (R, F)}
    for source, target in itertools.product((Q, R, S, F), repeat=2):
        if (source, target) in legal:
            states.check_transition("r", source, target)
        else:
            with pytest.raises(FailedPrecondition, match=f"{states.state_name(source)} -> {states.state_name(target)}"):
                states.check_transition("r", source, target)
    with pytest.raises(InvalidArgument):
        states.check_transition("r", Q, rollout_pb2.ROLLOUT_STATE_UNSPECIFIED)
    assert {S, F} == states.TERMINAL


def _event(seq: int, ev: event_pb2.Event) -> event_pb2.Event:
    ev.sequence = seq
    return ev


def test_triplet_view_keeps_last_call_per_prompt_at_its_position():
    events = [
        _event(1, model_request("r", [1], [2], [-1.0])),
        _event(2, model_request("r", [9], [8], [-1.0, -2.0])),  # lengths differ: log-probs dropped
        _event(3, model_request("r", [1], [3], [-0.5])),
        _event(4, event_pb2.Event(event_type="note", data_json="{}")),
        _event(5, reward("r", 1.0)),
    ]
    view = triplet_view(events)
    assert [e.sequence for e in view] == [2, 3, 5]
    assert not view[0].model_request.has_response_logprobs and not view[0].model_request.response_logprobs
    assert list(view[1].model_request.response_token_ids) == [3]
    assert view[1].model_request.request_json == ""
    assert view[2].reward.value == 1.0 and view[2].reward.message == ""


def test_terminal_log_paging_removal_and_reached_cursor():
    log = TerminalLog()
    for i in range(10):
        assert log.append(f"r{i}") == i + 1
    log.remove("r3")
    items, reached = log.read(0, 4, lambda rid: rid != "r1")
    assert items == [(1, "r0"), (3, "r2"), (5, "r4"), (6, "r5")] and reached == 6
    items, reached = log.read(6, 100, lambda rid: False)
    assert items == [] and reached == 10
    for i in range(10, 3000):
        log.append(f"r{i}")
    for i in range(0, 2500):
        log.remove(f"r{i}")  # triggers compaction
    items, _ = log.read(0, 2, lambda rid: True)
    assert items == [(2501, "r2500"), (2502, "r2501")]
    assert log.next_cursor() == 3001


def _change(revision: int, state: int, previous: int = rollout_pb2.ROLLOUT_STATE_UNSPECIFIED) -> Change:
    rollout = rollout_pb2.Rollout(rollout_id=f"r{revision}")
    rollout.status.state = state
    rollout.metadata.labels["run"] = "a"
    return Change(revision, ledger_service_pb2.ROLLOUT_CHANGE_TYPE_UPSERT, rollout, previous, 0)


async def test_hub_ring_and_subscriber_cut_off():
    hub = RolloutHub(start_revision=0, ring_size=5, subscriber_limit=2)
    queued = hub.subscribe(RolloutFilter([Q]))
    other = hub.subscribe(RolloutFilter([], {"run": "b"}))
    for rev in range(1, 8):
        hub.publish(_change(rev, Q))
    with pytest.raises(OutOfRange, match="no longer kept"):
        hub.changes_after(1, 7)
    with pytest.raises(OutOfRange, match="ahead"):
        hub.changes_after(8, 7)
    assert [c.revision for c in hub.changes_after(4, 7)] == [5, 6, 7]
    # The queuing watcher fell more than 2 behind: cut, naming where to resume; the other saw nothing to queue.
    queued.last_revision = 0
    with pytest.raises(ResourceExhausted, match="after_revision=0"):
        await queued.next()
    assert hub.subscriber_count == 1
    # A change that leaves the filter concerns the watcher; one outside before and after does not.
    f = RolloutFilter([Q])
    assert f.concerns(_change(9, R, previous=Q)) and not f.concerns(_change(9, S, previous=R))
    hub.unsubscribe(other)
    assert hub.subscriber_count == 0


def test_wire_helpers_match_protobuf_encoding():
    events = [model_request("r", [1, 2], [3]).SerializeToString(), reward("r", 0.5).SerializeToString()]
    raw = wire.repeated(1, events) + ledger_service_pb2.ListEventsResponse(next_page_token="7").SerializeToString()
    parsed = ledger_service_pb2.ListEventsResponse.FromString(raw)
    assert [e.SerializeToString() for e in parsed.events] == events and parsed.next_page_token == "7"
    assert wire.varint(300) == b"\xac\x02"


def test_proxy_control_expiry_with_a_fake_clock():
    now = [100.0]
    control = ProxyControlState(monotonic=lambda: now[0])
    control.report("p1", 2, 0, 10.0, False, 0)
    control.report("p2", 0, 0, 30.0, False, 0)
    assert control.expire() == pytest.approx(10.0)
    now[0] = 111.0
    assert [r.replica_id for r in control.snapshot().replicas] == ["p2"]
    control.set_pause(True, 0, "x", 0)
    assert control.snapshot().generation == 1 and control.snapshot().retry_after_seconds == 5
    persisted = proxy_control_pb2.ProxyControl.FromString(control.persisted())
    assert persisted.paused and not persisted.replicas


async def test_core_rollout_lifecycle_and_errors(core: Ledger):
    [(rollout, created)] = await core.create_rollouts([spec("a")])
    assert created and rollout.status.state == Q
    with pytest.raises(Aborted):
        await core.update_status("a", R, expected_version=5)
    running = await core.update_status("a", R, attempt_id="t1", expected_version=1)
    assert running.status.version == 2
    with pytest.raises(NotFound, match="zzz"):
        await core.update_status("zzz", R)
    seqs, attempts = await core.append_events([model_request("a", [1], [2], [-0.1]), reward("a", 1.0)])
    assert seqs == [1, 2] and attempts == ["t1", "t1"]
    with pytest.raises(NotFound):
        await core.append_events([reward("a", 1.0), reward("nope", 1.0)])
    done = await core.update_status("a", S)
    with pytest.raises(FailedPrecondition):
        await core.append_events([reward("a", 1.0)])
    items, reached = await feeds.list_terminal(core, 0, {}, True, 10)
    assert reached == 1 and items[0][1] == done and len(items[0][2]) == 2
    assert core.state_counts[S] == 1 and core.events_appended == 2


async def test_core_watch_feed_snapshot_then_live(core: Ledger):
    await core.create_rollouts([spec("a"), spec("b")])
    feed = feeds.watch_rollouts(core, [Q], {}, 0)
    got = [await anext(feed) for _ in range(3)]
    assert [g[0] for g in got] == [1, 1, 2]  # SNAPSHOT, SNAPSHOT, SYNCED
    await core.update_status("a", R)
    _kind, revision, rollout = await asyncio.wait_for(anext(feed), 5)
    assert rollout.rollout_id == "a" and rollout.status.state == R and revision == 3
    await feed.aclose()
    assert core.hub.subscriber_count == 0


async def test_sqlite_group_commit_and_restore(tmp_path: Path):
    path = tmp_path / "l.db"
    store = SqliteStore(path)
    commits: list[int] = []
    store.commit_observer = lambda seconds, ops: commits.append(ops)
    core = Ledger(store)
    core.load()
    await core.create_rollouts([spec(f"r{i}") for i in range(8)])
    await asyncio.gather(*(core.append_events([reward(f"r{i % 8}", float(i), event_id=f"e{i}")]) for i in range(200)))
    assert sum(commits) == 8 + 1 + 200  # the create (8 rollouts + the revision) then one op per event
    assert len(commits) < 100, "concurrent writes should share commits"
    await core.update_status("r0", R, attempt_id="x")
    await core.update_status("r0", F, error_message="boom")
    await core.close()

    again = Ledger(SqliteStore(path))
    again.load()
    assert again.revision == core.revision and again.terminal.last_cursor == 1
    assert again.rollouts["r0"].rollout == core.rollouts["r0"].rollout
    assert again.rollouts["r1"].next_seq == 26
    seqs, _ = await again.append_events([reward("r1", 1.0, event_id="e1")])
    assert seqs == [1]  # e1 was r1's first event: still recognised
    with pytest.raises(AlreadyExists, match="e1"):  # and the same id with other content is refused
        await again.append_events([reward("r1", 0.0, event_id="e1")])
    await again.close()


async def test_a_reloaded_runs_ring_resumes_after_any_revision_from_its_floor(tmp_path: Path):
    """After a restart the runs ring holds the newest change of each stored run and step: a resume after any revision
    from the floor on replays what changed since, once. The floor is where the ring's size or a deletion cut it."""
    path = tmp_path / "l.db"
    core = Ledger(SqliteStore(path))
    core.load()
    await core.runs.create("a", {}, "")  # revision 1
    for step in (1, 2, 3):  # each report: the step (2, 4, 6), then the run (3, 5, 7)
        await core.runs.report_steps("a", [run_pb2.RunStep(step=step, metrics={"m": float(step)})])
    await core.close()

    async def replay(ledger: Ledger, after: int) -> list[tuple[int, int]]:
        feed = ledger.runs.watch("", {}, True, after)
        items = []
        async for kind, revision, _, step in feed:
            if kind == ledger_service_pb2.RUN_CHANGE_TYPE_SYNCED:
                break
            items.append((revision, step.step if step is not None else 0))
        await feed.aclose()
        return items

    again = Ledger(SqliteStore(path), ring_size=3)  # keeps revisions 4, 6 and 7: the floor is 2
    again.load()
    assert await replay(again, 2) == [(4, 2), (6, 3), (7, 0)]
    assert await replay(again, 3) == await replay(again, 2)  # 3 was the run's, replaced by 7
    assert await replay(again, 6) == [(7, 0)] and await replay(again, 7) == []
    with pytest.raises(OutOfRange, match="no longer kept"):
        await replay(again, 1)
    await again.runs.create("b", {}, "")  # 8
    assert await again.runs.delete(["b"]) == 1  # 9
    await again.close()

    third = Ledger(SqliteStore(path))
    third.load()
    assert await replay(third, 9) == []
    with pytest.raises(OutOfRange, match="no longer kept"):  # b's deletion is not in the store to replay
        await replay(third, 8)
    await third.close()


def test_config_flags_override_environment_defaults():
    from services.ledger.config import parse_args

    env = {"AGL_LEDGER_PORT": "6000", "AGL_LEDGER_STORE": "sqlite:/tmp/x.db", "AGL_KEY": "k", "AGL_LOG_FORMAT": "json"}
    config = parse_args([], env)
    assert (config.port, config.sqlite_path, config.key, config.auth_mode, config.log_format) == (
        6000, "/tmp/x.db", "k", "bearer key", "json",
    )  # fmt: skip
    config = parse_args(["--port", "7000", "--store", "memory", "--metrics-port", "0"], env)
    assert (config.port, config.sqlite_path, config.metrics_port, config.max_message_mb) == (7000, None, 0, 64)
    with pytest.raises(SystemExit):
        parse_args(["--store", "postgres://x"], {})
