"""Typed async client for the ledger, shared by the proxy, controller and trainer."""

from __future__ import annotations

from .ledger_client import LedgerClient, LedgerError
from .ledger_link import REFUSED_CODES, LedgerLink, refused_message
from .retry import THROUGH_RESTARTS, RetryPolicy, backoff_s
from .tokens import agent_token, verify_agent_token

__all__ = [
    "REFUSED_CODES",
    "THROUGH_RESTARTS",
    "LedgerClient",
    "LedgerError",
    "LedgerLink",
    "RetryPolicy",
    "agent_token",
    "backoff_s",
    "refused_message",
    "verify_agent_token",
]
