"""Stopping the proxy's background tasks (models stream, control watch, heartbeat)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def stop_tasks(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancels every task, then waits for each to end; an error other than the cancellation is raised."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
