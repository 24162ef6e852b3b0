"""Exit codes of `agl` and the one-line messages a shell user gets for ledger errors (no tracebacks).

0 success; 1 any other failure; 2 bad usage, bad input or an unknown id; 3 the ledger cannot be reached;
4 the ledger refused the key; 5 a wait (drain) timed out.
"""

from __future__ import annotations

from services.client import InvalidArgument, LedgerError, NotFound, OutOfRange, Refused, Transient

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


def from_rpc(err: LedgerError, address: str, unreachable_hint: str = "") -> CliError:
    if isinstance(err, Transient):
        return CliError(
            f"cannot reach the ledger at {address} ({err.code_name.lower()}); is it running? "
            f"set --ledger or AGL_LEDGER_ADDR{unreachable_hint}",
            UNREACHABLE,
        )
    if isinstance(err, Refused):
        return CliError(f"the ledger at {address} refused the key ({err.message}); set --key or AGL_KEY", DENIED)
    if isinstance(err, (NotFound, InvalidArgument, OutOfRange)):
        return CliError(err.message, USAGE)
    return CliError(f"{err.message} ({err.code_name})", FAILURE)
