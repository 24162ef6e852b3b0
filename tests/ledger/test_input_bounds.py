"""Issue 30, the ledger's part of the second probe (real ledger processes): values that used to be accepted and then
broke arithmetic are refused at the door naming the field, and what is already stored never strands a rollout."""

from __future__ import annotations

import sqlite3

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, model_pb2, rollout_pb2
from tests.support.procs import start_ledger

from .support import FAILED, QUEUING, RUNNING, expect_error, spec, update

R = rollout_pb2
KILLED = R.FAILURE_REASON_KILLED
ONE_DAY = 86_400


async def _create(stub, rollout_id: str, policy: rollout_pb2.RetryPolicy) -> rollout_pb2.Rollout:
    created = spec(rollout_id)
    created.config.retry.CopyFrom(policy)
    return (await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[created]))).rollouts[0]


def _wait_s(status: rollout_pb2.RolloutStatus) -> float:
    return (status.retry_time.ToNanoseconds() - status.update_time.ToNanoseconds()) / 1e9


# -- finding 3: retry backoffs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_backoff_seconds", 1e20),
        ("initial_backoff_seconds", 1e300),
        ("max_backoff_seconds", 1e300),
        ("max_backoff_seconds", ONE_DAY + 1),
        ("backoff_multiplier", 1e300),
        ("backoff_multiplier", float("nan")),
    ],
)
async def test_retry_backoffs_beyond_the_bounds_are_refused_at_create_naming_the_field(
    stub, uid: str, field: str, value: float
) -> None:
    policy = R.RetryPolicy(max_attempts=3, **{field: value})
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, _create(stub, f"{uid}-r", policy))
    assert f"config.retry.{field}" in details and "between 0 and" in details
    await expect_error(grpc.StatusCode.NOT_FOUND, stub.GetRollout(pb.GetRolloutRequest(rollout_id=f"{uid}-r")))


async def test_the_largest_accepted_backoffs_are_accepted(stub, uid: str) -> None:
    policy = R.RetryPolicy(initial_backoff_seconds=ONE_DAY, max_backoff_seconds=ONE_DAY, backoff_multiplier=100)
    created = await _create(stub, f"{uid}-r", policy)
    assert created.config.retry.backoff_multiplier == 100


async def test_a_backoff_that_grows_past_any_clock_never_strands_the_rollout(stub, uid: str) -> None:
    """Accepted values whose product outgrows a timestamp (10 s x 100^(n-1), no max): the attempt's failure is
    still recorded and the rollout requeued, the wait cut to one day, up to the last attempt."""
    rid = f"{uid}-r"
    await _create(stub, rid, R.RetryPolicy(max_attempts=8, initial_backoff_seconds=10, backoff_multiplier=100))
    waits = []
    for n in range(1, 8):
        await update(stub, rid, RUNNING, attempt_id=f"a{n}")
        status = (await update(stub, rid, FAILED, failure_reason=KILLED, ending_attempt_id=f"a{n}")).status
        assert status.state == QUEUING, status
        waits.append(round(_wait_s(status)))
    assert waits == [10, 1000, ONE_DAY, ONE_DAY, ONE_DAY, ONE_DAY, ONE_DAY]
    await update(stub, rid, RUNNING, attempt_id="a8")
    final = (await update(stub, rid, FAILED, failure_reason=KILLED, ending_attempt_id="a8")).status
    assert final.state == FAILED and len(final.attempts) == 8


async def test_a_policy_stored_before_the_bounds_still_retries_after_a_restart(tmp_path) -> None:
    """A ledger file from before the bounds holds the probe's policy (initial 1e300 s, multiplier 1e300): failing its
    attempt requeues the rollout with a one-day wait instead of UNKNOWN forever."""
    path = tmp_path / "ledger.db"
    with start_ledger(store=f"sqlite:{path}") as ledger:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await _create(stub, "old", R.RetryPolicy(max_attempts=3, initial_backoff_seconds=1))
            await update(stub, "old", RUNNING, attempt_id="a1")
    with sqlite3.connect(path) as db:  # what the older ledger stored, written as it would have
        (data,) = db.execute("SELECT data FROM rollouts WHERE rollout_id = 'old'").fetchone()
        rollout = R.Rollout.FromString(data)
        rollout.config.retry.initial_backoff_seconds = 1e300
        rollout.config.retry.backoff_multiplier = 1e300
        db.execute("UPDATE rollouts SET data = ? WHERE rollout_id = 'old'", (rollout.SerializeToString(),))
    with start_ledger(store=f"sqlite:{path}") as ledger:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            status = (await update(stub, "old", FAILED, failure_reason=KILLED, ending_attempt_id="a1")).status
            assert status.state == QUEUING and round(_wait_s(status)) == ONE_DAY
            await update(stub, "old", RUNNING, attempt_id="a2")
            status = (await update(stub, "old", FAILED, failure_reason=KILLED, ending_attempt_id="a2")).status
            assert status.state == QUEUING and round(_wait_s(status)) == ONE_DAY


# -- finding 11: registered endpoint URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "http://127.0.0.1:9/v1\n2026-12-02 INFO services.proxy forged line",
        "http://127.0.0.1:9/v1\r\n",
        "http://a\x1b[2J:9/v1",
        "http://a b/v1",
        "127.0.0.1:8000/v1",
        "ftp://a/v1",
        "http:///v1",
        "http://a:99999/v1",
        "http://a:0/v1",
        "http://a/v1?key=1",
        "http://a/v1#x",
        "http://é.example/v1",
    ],
)
async def test_an_endpoint_that_is_not_an_http_url_is_refused_naming_it_and_nothing_is_stored(stub, uid, bad) -> None:
    name = f"{uid}-model"
    good = model_pb2.ModelEndpoint(model_name=name, endpoint="http://10.0.0.5:8000/v1", version=1)
    wrong = model_pb2.ModelEndpoint(model_name=name, endpoint=bad, version=1)
    request = pb.RegisterModelsRequest(endpoints=[good, wrong])
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.RegisterModels(request))
    assert "endpoints[1].endpoint" in details and repr(bad) in details, details
    assert not (await stub.ListModels(pb.ListModelsRequest(model_name=name))).endpoints  # the good one neither


@pytest.mark.parametrize(
    "url", ["http://e", "http://127.0.0.1:8000/v1", "https://engine.example/v1/", "http://[::1]:80"]
)
async def test_http_urls_are_registered(stub, uid, url: str) -> None:
    name = f"{uid}-model"
    endpoint = model_pb2.ModelEndpoint(model_name=name, endpoint=url, version=1)
    await stub.RegisterModels(pb.RegisterModelsRequest(endpoints=[endpoint]))
    assert [e.endpoint for e in (await stub.ListModels(pb.ListModelsRequest(model_name=name))).endpoints] == [url]
