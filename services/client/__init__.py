"""Typed async client for the ledger, shared by the proxy, controller and trainer.

Every failed call raises a `LedgerError` subclass (errors.py); callers never see gRPC's own exception types.
"""

from __future__ import annotations

from .errors import (
    RETRY_LATER,
    AlreadyExists,
    Cancelled,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LedgerError,
    NotFound,
    OutOfRange,
    Refused,
    ResourceExhausted,
    Transient,
    Unavailable,
    Unimplemented,
    Unknown,
)
from .informer import ROLLOUTS, RUNS, Handler, Informer
from .ledger_client import LedgerClient
from .ledger_link import LedgerLink, refused_message
from .retry import THROUGH_RESTARTS, RetryPolicy, backoff_s
from .tokens import agent_token, verify_agent_token

__all__ = [
    "RETRY_LATER",
    "ROLLOUTS",
    "RUNS",
    "THROUGH_RESTARTS",
    "AlreadyExists",
    "Cancelled",
    "Conflict",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Handler",
    "Informer",
    "Internal",
    "InvalidArgument",
    "LedgerClient",
    "LedgerError",
    "LedgerLink",
    "NotFound",
    "OutOfRange",
    "Refused",
    "ResourceExhausted",
    "RetryPolicy",
    "Transient",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "agent_token",
    "backoff_s",
    "refused_message",
    "verify_agent_token",
]
