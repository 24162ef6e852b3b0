"""Exit codes of `agl` and the one-line messages a shell user gets for ledger errors (no tracebacks).

0 success; 1 any other failure; 2 bad usage, bad input or an unknown id; 3 the ledger cannot be reached;
4 the ledger refused the key; 5 a wait (drain) timed out.
"""

from __future__ import annotations

import grpc

OK = 0
FAILURE = 1
USAGE = 2
UNREACHABLE = 3
DENIED = 4
TIMED_OUT = 5


class CliError(Exception):
    """A failure with its exit code and a message for the user."""

    def __init__(self, message: str, code: int = FAILURE) -> None:
        super().__init__(message)
        self.code = code


def from_rpc(err: grpc.aio.AioRpcError, address: str) -> CliError:
    code = err.code()
    details = err.details() or code.name
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return CliError(
            f"cannot reach the ledger at {address} ({code.name.lower()}); is it running? "
            "set --ledger or AGL_LEDGER_ADDR",
            UNREACHABLE,
        )
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return CliError(f"the ledger at {address} refused the key ({details}); set --key or AGL_KEY", DENIED)
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return CliError(details, USAGE)
    return CliError(f"{details} ({code.name})", FAILURE)
