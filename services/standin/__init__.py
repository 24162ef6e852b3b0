"""A vLLM-shaped OpenAI server with a deterministic toy model, standing in for vLLM in tests and demos."""

from __future__ import annotations
