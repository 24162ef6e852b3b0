"""Typed async client for the ledger, shared by the proxy, controller and trainer."""

from __future__ import annotations

from .ledger_client import LedgerClient, LedgerError
from .retry import RetryPolicy
from .tokens import agent_token, verify_agent_token

__all__ = ["LedgerClient", "LedgerError", "RetryPolicy", "agent_token", "verify_agent_token"]
