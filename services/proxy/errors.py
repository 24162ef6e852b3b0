"""Domain errors of the proxy and the one table that maps them, and ledger (gRPC) statuses, to HTTP.

An error's body is OpenAI-shaped, {"error": {"message", "type", "code"}}, with the status of the table; a route of
another agent API answers it in that API's shape (error_shapes.py), the status unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

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
    "rollout_not_found": (404, "not_found_error"),
    "rollout_terminal": (409, "conflict_error"),
    "event_conflict": (409, "conflict_error"),
    "body_too_large": (413, "invalid_request_error"),
    # The ledger refused to store the event over a per-rollout limit (or its size). 413, not 429: waiting frees
    # nothing, and the OpenAI and Anthropic SDKs retry 429 by themselves, each retry another engine call refused.
    "quota_exceeded": (413, "invalid_request_error"),
    "invalid_event": (422, "invalid_request_error"),
    "paused": (429, "rate_limit_error"),
    "internal": (500, "internal_error"),
    "upstream_unreachable": (502, "upstream_error"),
    "no_endpoint": (503, "service_unavailable_error"),
    "engine_not_current": (503, "service_unavailable_error"),  # every engine held back (engine_check.py)
    "ledger_unavailable": (503, "service_unavailable_error"),
    "ledger_refused": (503, "service_unavailable_error"),
    "upstream_timeout": (504, "upstream_error"),
}

# gRPC status name of a failed ledger call -> error kind. Anything else is logged and becomes "internal".
LEDGER_STATUS_KINDS: dict[str, str] = {
    "NOT_FOUND": "rollout_not_found",
    "FAILED_PRECONDITION": "rollout_terminal",
    "INVALID_ARGUMENT": "invalid_request",
    "ALREADY_EXISTS": "event_conflict",
    "OUT_OF_RANGE": "invalid_request",
    "UNAVAILABLE": "ledger_unavailable",
    "DEADLINE_EXCEEDED": "ledger_unavailable",
    "RESOURCE_EXHAUSTED": "quota_exceeded",
    "ABORTED": "ledger_unavailable",
    "CANCELLED": "ledger_unavailable",
    # The ledger refuses the proxy's own key: the operator's mistake, not the agent's; nothing was recorded.
    "UNAUTHENTICATED": "ledger_refused",
    "PERMISSION_DENIED": "ledger_refused",
}


# gRPC status name of a failed ledger call -> HTTP status on Agent Lightning v1.0's REST routes (rest_routes.py),
# which answer v1.0's {"detail": ...} bodies rather than OpenAI-shaped ones. Anything else is logged and answered 500.
V1_STATUS_CODES: dict[str, int] = {
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "INVALID_ARGUMENT": 422,
    "OUT_OF_RANGE": 422,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 503,
    "RESOURCE_EXHAUSTED": 503,
}


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


def ledger_error(status_name: str, details: str, what: str) -> ProxyError:
    """The ProxyError for a ledger call `what` that failed with gRPC status `status_name`."""
    kind = LEDGER_STATUS_KINDS.get(status_name)
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
