"""Trivial agent classes for agent_runner tests."""

from __future__ import annotations

import asyncio


class SyncAgent:
    def run(self) -> None:
        print("SyncAgent ran")


class AsyncAgent:
    async def run(self) -> None:
        await asyncio.sleep(0)
        print("AsyncAgent ran")


class FailingAgent:
    def run(self) -> None:
        raise RuntimeError("agent failed on purpose")
