"""Domain errors of the ledger core.

Every error the core raises is a `LedgerError`; the transport maps each subclass to one status code in one
table (`servicer.STATUS_BY_ERROR`). Messages are meant for the caller and name the offending ids and values.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every domain error."""


class NotFound(LedgerError):
    """A named rollout (or other resource) does not exist."""


class InvalidArgument(LedgerError):
    """The request is malformed: a bad field value, invalid JSON text, a missing required field."""


class AlreadyExists(LedgerError):
    """A caller-chosen id is taken by something else (an event id appended before with a different payload)."""


class FailedPrecondition(LedgerError):
    """The request is well-formed but the stored state forbids it (illegal transition, terminal rollout)."""


class Aborted(LedgerError):
    """A compare-and-set lost: the stored version is not the one the caller expected."""


class OutOfRange(LedgerError):
    """A watch asked to resume from a revision the ledger no longer keeps; start over with a snapshot."""


class ResourceExhausted(LedgerError):
    """A consumer fell too far behind (or a request is too large); the message says where to resume."""


class QuotaExceeded(ResourceExhausted):
    """An append would take a rollout past one of its limits (quotas.py); `limit` names which, for metrics."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Unavailable(LedgerError):
    """The ledger cannot serve the request now (store failed, shutting down); retry later."""
