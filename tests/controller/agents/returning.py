"""Agents in the older Agent Lightning style: run() returns the reward (and one also posts its own)."""

from __future__ import annotations

import os

import httpx


class ReturnsReward:
    def run(self) -> float:
        return float(os.environ.get("RETURNED", "0.75"))


class PostsAndReturns:
    """Posts a reward of 1.0, then returns 0.0: the posted one counts, once."""

    async def run(self) -> float:
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(
                os.environ["AGL_EVENT_URL"],
                json={"event_type": "reward", "data": {"value": 1.0, "source": "posted"}},
                headers={"Authorization": f"Bearer {os.environ['AGL_KEY']}"},
            )
            response.raise_for_status()
        return 0.0


class ReturnsTrue:
    def run(self) -> bool:
        return True


class ReturnsText:
    async def run(self) -> str:
        return "0.9"
