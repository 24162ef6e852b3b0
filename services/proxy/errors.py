"""Domain errors of the proxy and the one table that maps them, and the client's typed ledger errors, to HTTP.

An error's body is OpenAI-shaped, {"error": {"message", "type", "code"}}, with the status of the table; a route of
another agent API answers it in that API's shape (routes/error_shapes.py), the status unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from services.client import errors as ledger

log = logging.getLogger(__name__)

# kind -> (HTTP status, OpenAI error type). The kind is also the error's `code`.
ERROR_TABLE: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "invalid_request_error"),
    "invalid_request": (400, "invalid_request_error"),
    "engine_has_no_tool_parser": (400, "invalid_request_error"),
    "over_request_limit": (400, "invalid_request_error"),  # n or an output-token limit above the proxy's
    "unauthorized": (401, "authentication_error"),
    "forbidden": (403, "permission_error"),
    "not_found": (404, "not_found_error"),
    # The rollout's role map (services/role_map.py) refuses the model name the request sends (as the OpenAI API
    # answers a model it does not serve: 404); or the map itself cannot be read (the run's mistake: 400).
    "model_not_mapped": (404, "not_found_error"),
    "role_map_invalid": (400, "invalid_request_error"),
    "rollout_not_found": (404, "not_found_error"),
    "rollout_terminal": (409, "conflict_error"),
    "event_conflict": (409, "conflict_error"),
    "conflict": (409, "conflict_error"),
    "body_too_large": (413, "invalid_request_error"),
    # The ledger refused to store the event over a per-rollout limit (or its size). 413, not 429: waiting frees
    # nothing, and the OpenAI and Anthropic SDKs retry 429 by themselves, each retry another engine call refused.
    "quota_exceeded": (413, "invalid_request_error"),
    "invalid_event": (422, "invalid_request_error"),
    "paused": (429, "rate_limit_error"),
    "internal": (500, "internal_error"),
    "upstream_unreachable": (502, "upstream_error"),
    "no_endpoint": (503, "service_unavailable_error"),
    "engine_not_current": (503, "service_unavailable_error"),  # every engine held back (engines/weight_check.py)
    "ledger_unavailable": (503, "service_unavailable_error"),
    "ledger_refused": (503, "service_unavailable_error"),
    "upstream_timeout": (504, "upstream_error"),
}

# The client's error of a failed ledger call -> error kind: the one meaning each ledger status has for the proxy's
# callers, on every route and in every dialect. A class not listed takes its nearest listed base; anything else is
# logged and becomes "internal".
LEDGER_ERROR_KINDS: dict[type[ledger.LedgerError], str] = {
    ledger.NotFound: "rollout_not_found",
    ledger.FailedPrecondition: "rollout_terminal",
    ledger.InvalidArgument: "invalid_request",
    ledger.AlreadyExists: "event_conflict",
    ledger.Conflict: "conflict",  # ABORTED: a compare-and-set lost (google/rpc/code.proto: HTTP 409)
    ledger.OutOfRange: "invalid_request",
    ledger.Transient: "ledger_unavailable",
    ledger.Cancelled: "ledger_unavailable",
    ledger.ResourceExhausted: "quota_exceeded",
    # The ledger refuses the proxy's own key: the operator's mistake, not the agent's; nothing was recorded.
    ledger.Refused: "ledger_refused",
}

# Agent Lightning v1.0's REST routes (v1/rest_routes.py) answer {"detail": ...} bodies with the status of ERROR_TABLE,
# except that a request the ledger finds invalid is FastAPI's 422 there, as in v1.0.
V1_STATUS_OVERRIDES: dict[str, int] = {"invalid_request": 422}

_ERROR_BY_NAME: dict[str, type[ledger.LedgerError]] = {code.name: cls for code, cls in ledger.ERROR_BY_STATUS.items()}


def ledger_kind(error: type[ledger.LedgerError]) -> str | None:
    """The error kind of a ledger error class (its own entry or its nearest base's), None when unmapped."""
    return next((LEDGER_ERROR_KINDS[c] for c in error.__mro__ if c in LEDGER_ERROR_KINDS), None)


class ProxyError(Exception):
    """An error answered to the agent; `kind` selects the HTTP status and error type from ERROR_TABLE."""

    def __init__(self, kind: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        if kind not in ERROR_TABLE:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind = kind
        self.message = message
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return ERROR_TABLE[self.kind][0]

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TABLE[self.kind][1], "code": self.kind}}


def v1_status(err: ledger.LedgerError) -> int | None:
    """The HTTP status of a ledger error on v1.0's REST routes; None when unmapped (answered 500 and logged)."""
    kind = ledger_kind(type(err))
    return None if kind is None else V1_STATUS_OVERRIDES.get(kind, ERROR_TABLE[kind][0])


def from_ledger(err: ledger.LedgerError, what: str) -> ProxyError:
    """The ProxyError for a ledger call `what` that failed with `err`."""
    return ledger_error(err.code_name, err.details() or "", what)


def ledger_error(status_name: str, details: str, what: str) -> ProxyError:
    """The ProxyError for a ledger call `what` that failed with the status named `status_name`."""
    error = _ERROR_BY_NAME.get(status_name)
    kind = ledger_kind(error) if error is not None else None
    if kind is None:
        log.error("ledger %s failed with unexpected status %s: %s", what, status_name, details)
        kind = "internal"
    if kind == "ledger_unavailable":
        return ProxyError(kind, f"The ledger is unavailable ({status_name}: {details}); the call was not recorded.")
    if kind == "quota_exceeded":
        return ProxyError(kind, f"The ledger refused to store this ({details}); it was not recorded.")
    if kind == "ledger_refused":
        return ProxyError(kind, "The ledger refused the proxy's key (see the proxy's log); the call was not recorded.")
    return ProxyError(kind, details or f"{what} failed: {status_name}")
