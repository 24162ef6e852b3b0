"""The OpenAI-compatible proxy: forwards agents' model calls to the engines and records each in the ledger."""

from __future__ import annotations
