"""Every ledger RPC fed generated and malformed requests: hostile values in well-formed messages, raw bytes that
are no message, strings that are not UTF-8, with and without the key. The ledger answers each with a status that
names a client mistake (never UNKNOWN, INTERNAL or a dropped connection) and its stored state stays consistent."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services._gen.agl.v1 import ledger_service_pb2
from tests.support.procs import ServiceProcess

from . import tally
from .conftest import FUZZ_KEY
from .consistency import check_ledger
from .strategies import messages, with_invalid_utf8

SERVICE = ledger_service_pb2.DESCRIPTOR.services_by_name["LedgerService"]
METHODS = list(SERVICE.methods)
# Statuses that say "your request was wrong or cannot be served now", each a documented answer.
CLIENT_STATUSES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a watch still open when the test's short deadline passed
}
# A request that is not a valid encoding is refused by grpc itself before any handler runs.
UNDECODABLE_STATUSES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}
_CODES = {code.value[0]: code for code in grpc.StatusCode}
KEYED = (("authorization", f"Bearer {FUZZ_KEY}"),)


@pytest.fixture(scope="module")
def channel(ledger: ServiceProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(ledger.address) as chan:
        yield chan


def call_raw(channel: grpc.Channel, method: object, payload: bytes, metadata: tuple) -> grpc.StatusCode:
    """Sends payload as the method's request (whatever its bytes) and returns the final status."""
    path = f"/{SERVICE.full_name}/{method.name}"  # type: ignore[attr-defined]
    identity = {"request_serializer": None, "response_deserializer": None}
    try:
        if method.client_streaming:  # type: ignore[attr-defined]
            # StreamAppendEvents answers each request in-band (error_code), and the stream goes on.
            call = channel.stream_stream(path, **identity)(iter([payload]), metadata=metadata, timeout=2)
            answers = [ledger_service_pb2.StreamAppendEventsResponse.FromString(raw) for raw in call]
            assert len(answers) <= 1, answers
            for answer in answers:
                if answer.error_code:
                    return _CODES[answer.error_code]
        elif method.server_streaming:  # type: ignore[attr-defined]
            call = channel.unary_stream(path, **identity)(payload, metadata=metadata, timeout=0.5)
            for _ in zip(call, range(3), strict=False):
                pass
            call.cancel()
        else:
            channel.unary_unary(path, **identity)(payload, metadata=metadata, timeout=5)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.CANCELLED:  # our own cancel after reading enough
            return grpc.StatusCode.OK
        return err.code()
    return grpc.StatusCode.OK


def record(target: str, code: grpc.StatusCode, allowed: set[grpc.StatusCode], what: object) -> None:
    tally.tried(target, code.name)
    if code not in allowed:
        tally.FAILED[target] += 1
        raise AssertionError(f"{target}: {code.name} for {what!r}"[:2000])


@pytest.fixture(scope="module", autouse=True)
def consistent_afterwards(ledger: ServiceProcess) -> Iterator[None]:
    yield
    figures = check_ledger(ledger, FUZZ_KEY)
    print(f"ledger consistent after fuzzing: {figures}")


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_well_formed_hostile_requests(channel: grpc.Channel, ledger: ServiceProcess, method) -> None:
    @given(request=messages(method.input_type), keyed=st.booleans())
    def run(request, keyed: bool) -> None:
        code = call_raw(channel, method, request.SerializeToString(), KEYED if keyed else ())
        allowed = CLIENT_STATUSES if keyed else {grpc.StatusCode.UNAUTHENTICATED}
        record(f"ledger {method.name}", code, allowed, request)

    run()
    assert ledger.alive()


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_malformed_encodings(channel: grpc.Channel, ledger: ServiceProcess, method) -> None:
    @given(request=messages(method.input_type), junk=st.binary(min_size=1, max_size=64), utf8=st.booleans())
    def run(request, junk: bytes, utf8: bool) -> None:
        encoded = request.SerializeToString()
        payload = with_invalid_utf8(encoded, method.input_type) if utf8 else junk
        try:
            type(request).FromString(payload)
            allowed = CLIENT_STATUSES  # the junk happened to decode: an ordinary request
        except Exception:
            allowed = UNDECODABLE_STATUSES
        record(f"ledger {method.name} (malformed)", call_raw(channel, method, payload, KEYED), allowed, payload)

    run()
    assert ledger.alive()
