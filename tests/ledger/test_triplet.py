"""The triplet view as cut at append time: wire-level split against the message-level reference, the stores'
events with their triplet form first, and bringing an older SQLite file up to date."""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path

import pytest

from services import wire
from services._gen.agl.v1 import event_pb2
from services.ledger import triplet
from services.ledger.ledger import Ledger
from services.ledger.sqlite_store import SqliteStore

from .support import custom, model_request, reward, spec


def _random_event(rng: random.Random) -> event_pb2.Event:
    """Events of every shape the view distinguishes, stamped like the ledger stamps them."""
    event = event_pb2.Event(
        rollout_id=f"r{rng.randrange(3)}",
        attempt_id=rng.choice(["", "a1"]),
        sequence=rng.randrange(1, 400),
        event_id=rng.choice(["", "e" * rng.randrange(1, 200)]),
    )
    event.create_time.FromNanoseconds(rng.randrange(1, 2**62))
    kind = rng.choice(["call", "call", "call", "reward", "data", "none"])
    if kind == "call":
        event.event_type = rng.choice(["model_request"] * 6 + ["other"])
        mr = event.model_request
        mr.request_json = rng.choice(["", '"' + "x" * rng.randrange(300) + '"'])
        mr.response_json = rng.choice(["", '"' + "y" * rng.randrange(3000) + '"'])
        mr.prompt_token_ids.extend(rng.randrange(-3, 2**40) for _ in range(rng.randrange(0, 40)))
        response = rng.randrange(0, 20)
        mr.response_token_ids.extend(rng.randrange(0, 2**20) for _ in range(response))
        if rng.random() < 0.7:
            logprobs = [-rng.random() * 10 for _ in range(response + rng.choice([0, 0, 0, 0, -1, 1]))]
            if logprobs and rng.random() < 0.2:
                logprobs[rng.randrange(len(logprobs))] = rng.choice([math.nan, math.inf, -math.inf])
            if rng.random() < 0.05:
                logprobs = [1e308] * len(logprobs)  # finite, but their sum overflows
            mr.response_logprobs.extend(logprobs)
        mr.has_response_logprobs = rng.random() < 0.8
        mr.model = rng.choice(["", "m"])
        mr.model_version = rng.randrange(0, 5)
        mr.endpoint = rng.choice(["", "http://engine:8000"])
        mr.latency_seconds = rng.random()
        mr.http_status = rng.choice([0, 200, 503])
        mr.retry_count = rng.randrange(0, 3)
        if rng.random() < 0.5:
            mr.usage.prompt_tokens = 5
        mr.finish_reason = rng.choice(["", "stop", "length"])
        mr.status = rng.randrange(0, 4)
        mr.api = rng.choice(["", "chat.completions"])
        mr.stream = rng.random() < 0.5
        if rng.random() < 0.3:
            mr.tool_calls.offered_tools = rng.randrange(1, 4)
        if rng.random() < 0.3:
            mr.warnings.extend(["tools[0] was left out"] * rng.randrange(1, 3))
        if rng.random() < 0.3:
            mr.requested_max_tokens, mr.granted_max_tokens = 32_000, rng.randrange(0, 512)
        if rng.random() < 0.5:
            mr.requested_model = rng.choice(["", "claude-haiku-4-5", "gpt-4o-mini"])
        if rng.random() < 0.5:
            mr.role = rng.randrange(0, 4)
    elif kind == "reward":
        event.event_type = rng.choice(["reward"] * 6 + ["score"])
        event.reward.value = rng.choice([0.0, 1.0, -0.5, math.nan])
        event.reward.message = rng.choice(["", "well done"])
        event.reward.source = rng.choice(["", "judge"])
        event.reward.reason = rng.choice(["", "exact"])
        event.reward.data_json = rng.choice(["", '{"k": 1}'])
    elif kind == "data":
        event.event_type = "note"
        event.data_json = "{}"
    else:
        event.event_type = rng.choice(["model_request", "reward", "note"])
    return event


def test_split_matches_the_message_level_trim_and_loses_nothing():
    rng = random.Random(7)
    in_view = 0
    for _ in range(3000):
        event = _random_event(rng)
        data = event.SerializeToString()
        stored, length = triplet.split(data)
        cut = stored[:length]
        reference = triplet.trim(event)
        if reference is None:
            assert length == 0 and stored == data
        else:
            in_view += 1
            assert event_pb2.Event.FromString(cut) == reference
            # Canonical bytes too: the same message as the reference, only the field order differs on the wire.
            assert event_pb2.Event.FromString(cut).SerializeToString() == reference.SerializeToString()
        assert event_pb2.Event.FromString(stored).SerializeToString() == data  # still the whole event
        slow, slow_length = triplet._split_messages(data)
        assert slow[:slow_length] == cut and event_pb2.Event.FromString(slow) == event
    assert in_view > 1500


def test_logprob_rules_on_the_wire_path():
    def logprobs_of(event: event_pb2.Event) -> tuple[bool, list[float]]:
        stored, length = triplet.split(event.SerializeToString())
        mr = event_pb2.Event.FromString(stored[:length]).model_request
        return mr.has_response_logprobs, list(mr.response_logprobs)

    assert logprobs_of(model_request("r", [1], [2, 3], [-0.5, -0.25])) == (True, [-0.5, -0.25])
    assert logprobs_of(model_request("r", [1], [2, 3], [-0.5])) == (False, [])  # not aligned
    assert logprobs_of(model_request("r", [1], [2, 3], [-0.5, math.nan])) == (False, [])
    assert logprobs_of(model_request("r", [1], [2, 3], [-math.inf, -0.1])) == (False, [])
    assert logprobs_of(model_request("r", [1], [2, 3], [1e308, 1e308])) == (True, [1e308, 1e308])  # sum overflows
    assert logprobs_of(model_request("r", [1], [2, 3], [-1e308, -0.5])) == (True, [-1e308, -0.5])  # top byte 0xFF
    assert logprobs_of(model_request("r", [1], [2, 3])) == (False, [])  # none returned
    assert logprobs_of(model_request("r", [1], [], [])) == (True, [])
    # Multi-byte response ids are counted per number, not per byte.
    assert logprobs_of(model_request("r", [1], [2**35, 300, 1], [-1.0, -2.0, -3.0])) == (True, [-1.0, -2.0, -3.0])


def test_unusual_encodings_take_the_message_path():
    event = model_request("r", [5, 6], [7], [-0.5])
    event.sequence = 3
    data = event.SerializeToString()
    # Unknown fields (a newer writer), fields out of order, unpacked repeated numbers: all still trimmed right.
    unknown = data + wire.field(99, b"future")
    reordered = (
        wire.field(4, b"model_request")
        + event_pb2.Event(rollout_id="r", sequence=3, model_request=event.model_request).SerializeToString()
    )
    unpacked = (
        event_pb2.Event(rollout_id="r", event_type="model_request").SerializeToString() + b"\x52\x04\x18\x05\x18\x06"
    )
    for encoded in (unknown, reordered, unpacked):
        parsed = event_pb2.Event.FromString(encoded)
        stored, length = triplet.split(encoded)
        assert event_pb2.Event.FromString(stored[:length]) == triplet.trim(parsed)
        assert event_pb2.Event.FromString(stored) == parsed
    stored, length = triplet.split(unknown)
    assert list(event_pb2.Event.FromString(stored[:length]).model_request.response_logprobs) == [-0.5]
    with pytest.raises((ValueError, IndexError)):
        wire.scan(b"\x0a\x05abc")  # a field longer than the message
    with pytest.raises(ValueError):
        wire.scan(b"\x0b")  # a group


def test_view_keeps_the_last_call_per_prompt_by_prompt_bytes():
    events = [
        model_request("r", [1, 300], [2], [-1.0]),
        model_request("r", [1, 300, 4], [2], [-1.0]),
        model_request("r", [], [5]),
        reward("r", 0.5),
        model_request("r", [1, 300], [3], [-0.5]),  # repeats the first prompt: the first one goes
        model_request("r", [], [6]),  # no prompt tokens either: nothing says it repeats seq 3, both stay
        custom("r", "{}"),
    ]
    rows = []
    for seq, event in enumerate(events, 1):
        event.sequence = seq
        stored, length = triplet.split(event.SerializeToString())
        if length:
            rows.append((seq, event.event_type, stored[:length]))
    assert triplet.prompt_key(rows[0][2]) == triplet.prompt_key(rows[4][2]) != triplet.prompt_key(rows[1][2])
    assert triplet.prompt_key(rows[2][2]) == b""
    assert [seq for seq, _ in triplet.view(rows)] == [2, 3, 4, 5, 6]
    assert [e.sequence for e in triplet.triplet_view(events)] == [2, 3, 4, 5, 6]


async def test_stores_give_back_whole_events_and_their_triplet_forms(core: Ledger):
    await core.create_rollouts([spec("a")])
    await core.update_status("a", 2, attempt_id="t1")
    rng = random.Random(3)
    appended = [_random_event(rng) for _ in range(80)]
    # What the ledger would refuse: a reward event without its payload.
    appended = [e for e in appended if e.event_type != "reward" or e.HasField("reward")]
    for i, event in enumerate(appended):
        event.rollout_id, event.attempt_id, event.event_id = "a", "", f"e{i}"
    await core.append_events(appended)  # stamps sequence, attempt and time on the messages
    full = [event_pb2.Event.FromString(data) for _, data in core.store.read_events("a", None, None, 0, 1000)]
    assert full == appended
    views = core.triplet_events("a", "t1", None)
    assert [event_pb2.Event.FromString(data) for _, data in views] == triplet.triplet_view(appended)
    rewards = core.triplet_events("a", "t1", "reward")
    assert all(event_pb2.Event.FromString(data).event_type == "reward" for _, data in rewards)
    assert core.triplet_events("a", "other-attempt", None) == []


async def test_an_older_sqlite_file_is_brought_up_to_date(tmp_path: Path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE events (rollout_id TEXT NOT NULL, seq INTEGER NOT NULL, attempt_id TEXT NOT NULL,
                             event_type TEXT NOT NULL, event_id TEXT, data BLOB NOT NULL);
        CREATE UNIQUE INDEX events_by_rollout ON events (rollout_id, seq);
        """
    )
    old = [model_request("a", [1], [2], [-0.5]), custom("a", "{}"), reward("a", 1.0), model_request("a", [1], [3])]
    for seq, event in enumerate(old, 1):
        event.sequence, event.attempt_id = seq, "t1"
        conn.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
            ("a", seq, "t1", event.event_type, None, event.SerializeToString()),
        )
    conn.commit()
    conn.close()

    store = SqliteStore(path)
    try:
        full = [event_pb2.Event.FromString(data) for _, data in store.read_events("a", None, None, 0, 100)]
        assert full == old
        view = triplet.view(store.read_triplets("a", "t1", None))
        assert [seq for seq, _ in view] == [3, 4]
        assert event_pb2.Event.FromString(view[1][1]).model_request.request_json == ""
    finally:
        await store.close()
