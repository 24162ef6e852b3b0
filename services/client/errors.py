"""The client's errors: every failed ledger call raises one subclass of `LedgerError`, chosen by one table.

gRPC statuses are mapped once, where they enter the client (`typed`), as httpx maps its transport's errors: callers
catch `NotFound`, `Conflict`, `Transient`... and never compare status codes. Each error still answers `code()` and
`details()` (it is a `grpc.aio.AioRpcError`), so code that logs the status keeps working; `code_name` is the
status's name, for logs and for tables keyed by name.

What a caller may do about an error is said here, once, by the class:
- `Transient` (UNAVAILABLE, DEADLINE_EXCEEDED): the ledger did not answer; the same call may succeed later. The
  client itself retries UNAVAILABLE on unary calls (`LedgerClient`'s retry policy).
- `RETRY_LATER`: the errors after which an idempotent call (ids chosen by the caller) is worth sending again
  after a pause: `Transient`, plus ABORTED, RESOURCE_EXHAUSTED, INTERNAL and UNKNOWN, which a busy or restarting
  ledger can answer to a call that a later try stores (google/rpc/code.proto: ABORTED is retried at a higher level).
- `STREAM_RESUMABLE` and `APPEND_STREAM_REOPEN`: the ends after which a watch, or the append stream, is opened
  again (each says why it is the set it is).
- `Refused` (UNAUTHENTICATED, PERMISSION_DENIED): the ledger refuses the caller's key; an operator must fix it.
"""

from __future__ import annotations

import grpc


class LedgerError(grpc.aio.AioRpcError):
    """A ledger call failed. `code_name` is the status's name; `details()` is the ledger's message."""

    @property
    def code_name(self) -> str:
        return self.code().name

    @property
    def message(self) -> str:
        """The ledger's message, or the status's name when it sent none."""
        return self.details() or self.code_name


class Transient(LedgerError):
    """The ledger did not answer (it is down, restarting or too slow); the same call may succeed later."""


class Unavailable(Transient):
    """UNAVAILABLE: the ledger cannot be reached or is shutting down."""


class DeadlineExceeded(Transient):
    """DEADLINE_EXCEEDED: no answer within the call's deadline (the call may still have been applied)."""


class Cancelled(LedgerError):
    """CANCELLED: the call was cancelled (the client closed, or the ledger cancelled the stream)."""


class NotFound(LedgerError):
    """NOT_FOUND: the named rollout, run or endpoint does not exist."""


class AlreadyExists(LedgerError):
    """ALREADY_EXISTS: a caller-chosen id is taken by something else."""


class Conflict(LedgerError):
    """ABORTED: a compare-and-set lost; the stored version is not the one the caller expected."""


class FailedPrecondition(LedgerError):
    """FAILED_PRECONDITION: the stored state forbids the call (an illegal transition, a rollout that has ended)."""


class InvalidArgument(LedgerError):
    """INVALID_ARGUMENT: the request is malformed."""


class OutOfRange(LedgerError):
    """OUT_OF_RANGE: a watch asked to resume from a revision the ledger no longer keeps."""


class ResourceExhausted(LedgerError):
    """RESOURCE_EXHAUSTED: over a quota or a size limit, or a watcher that fell too far behind."""


class Refused(LedgerError):
    """The ledger refuses the caller's key."""


class Unauthenticated(Refused):
    """UNAUTHENTICATED: no key, or a wrong one."""


class PermissionDenied(Refused):
    """PERMISSION_DENIED: the key may not make this call."""


class Unimplemented(LedgerError):
    """UNIMPLEMENTED: the ledger is older than the client and lacks the call."""


class Internal(LedgerError):
    """INTERNAL: the transport or the ledger broke an invariant (a cut stream surfaces as INTERNAL too)."""


class Unknown(LedgerError):
    """UNKNOWN, DATA_LOSS or a status nobody expected: an error inside the ledger."""


# The one table: gRPC status -> the error raised. A status not in it raises Unknown.
ERROR_BY_STATUS: dict[grpc.StatusCode, type[LedgerError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Unknown,
}

RETRY_LATER: tuple[type[LedgerError], ...] = (Transient, Conflict, ResourceExhausted, Internal, Unknown)

# A watch cut with one of these is re-opened from its resume point (a restart, a slow consumer cut off, a broken
# connection); anything else ends it.
STREAM_RESUMABLE: tuple[type[LedgerError], ...] = (Unavailable, ResourceExhausted, Internal)

# The append stream (append_stream.py) is re-opened, and its unanswered requests written again, when the stream as a
# whole ends with one of these. It differs from STREAM_RESUMABLE on purpose: a refusal of one request comes back as
# that request's own answer and leaves the stream open, so the stream's own status is about the transport: UNKNOWN
# (the ledger failed mid-stream) and CANCELLED (the call cut under it, not refused) are worth another stream, while
# RESOURCE_EXHAUSTED, which a watch meets when it falls behind, is not something an append stream is cut for.
APPEND_STREAM_REOPEN: tuple[type[LedgerError], ...] = (Unavailable, Internal, Unknown, Cancelled)


def typed(err: grpc.aio.AioRpcError) -> LedgerError:
    """The client's error for a failed gRPC call (the same object when it is one already)."""
    if isinstance(err, LedgerError):
        return err
    cls = ERROR_BY_STATUS.get(err.code(), Unknown)
    return cls(err.code(), err.initial_metadata(), err.trailing_metadata(), err.details(), err.debug_error_string())


def error(code: grpc.StatusCode, details: str) -> LedgerError:
    """An error the client raises itself (an append that waited past its deadline, a stream that broke)."""
    cls = ERROR_BY_STATUS.get(code, Unknown)
    return cls(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def copy(err: LedgerError) -> LedgerError:
    """The same error for another caller (one exception object raised in several tasks would share tracebacks)."""
    return type(err)(err.code(), err.initial_metadata(), err.trailing_metadata(), err.details(),
                     err.debug_error_string())  # fmt: skip
