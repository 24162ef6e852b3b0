"""Job templates rendered in two lanes of worker processes, so that slow templates hold up only each other.

Every render starts in the fast lane, with the quick limit (--template-quick-limit, 0.25 s) as its deadline. One that
runs over it is rendered again from the start in the slow lane, whose workers run at a lower CPU priority, with the
whole time limit (--template-timeout) as its deadline; past that its rollout fails. Workers keep the deadlines
themselves (template_worker.py), so neither lane restarts a process for a slow template.

The guarantee: a template that renders within the quick limit waits for no slow template. It waits at most
ceil(k / N) quick limits, k being the renders started before it that are still in the fast lane and N the workers of
a lane (--template-workers): each of them leaves the fast lane within the quick limit. Eight slow templates ahead of
a valid one on two workers: at most 1 s, instead of four whole time limits. (A rollout being rendered holds one of
the controller's --max-concurrency slots: the bound holds while slow templates hold fewer than all of them.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..core.outcome import ConfigError
from .template_worker import TemplateWorker

# Niceness of the slow lane's workers: the fast lane's renders get the CPU first.
_SLOW_NICE = 10


class _Lane:
    """Workers of one lane; a render waits for an idle one."""

    def __init__(self, count: int, deadline_s: float, *, memory_bytes: int, max_output_bytes: int, nice: int) -> None:
        self.deadline_s = deadline_s
        self.workers = [
            TemplateWorker(memory_bytes=memory_bytes, max_output_bytes=max_output_bytes, nice=nice)
            for _ in range(max(1, count))
        ]
        self._idle: asyncio.Queue[TemplateWorker] | None = None

    async def render(self, template: str, args: dict[str, Any]) -> dict[str, Any]:
        if self._idle is None:  # created on the running loop
            self._idle = asyncio.Queue()
            for worker in self.workers:
                self._idle.put_nowait(worker)
        worker = await self._idle.get()
        try:
            return await worker.render(template, args, self.deadline_s)
        finally:
            self._idle.put_nowait(worker)

    async def start(self) -> None:
        await asyncio.gather(*(worker.start() for worker in self.workers))

    async def close(self) -> None:
        await asyncio.gather(*(worker.close() for worker in self.workers))


class TemplateRenderer:
    """render_job in the render workers, within the time, memory and output limits; see the module's docstring."""

    def __init__(
        self,
        workers: int,
        *,
        timeout_s: float,
        memory_bytes: int,
        max_output_bytes: int,
        quick_limit_s: float = 0.25,
    ) -> None:
        self._timeout_s = timeout_s
        limits = {"memory_bytes": memory_bytes, "max_output_bytes": max_output_bytes}
        self.fast = _Lane(workers, min(quick_limit_s, timeout_s), nice=0, **limits)
        # With a time limit no longer than the quick limit there is nothing to finish elsewhere.
        self.slow = _Lane(workers, timeout_s, nice=_SLOW_NICE, **limits) if quick_limit_s < timeout_s else None

    async def render(self, template: str, **args: Any) -> dict[str, Any]:
        """render_job(template, **args). Raises ConfigError for a bad template or a broken limit."""
        reply = await self.fast.render(template, args)
        if "overtime" in reply and self.slow is not None:
            reply = await self.slow.render(template, args)
        if "overtime" in reply:
            raise ConfigError(f"invalid Job template: rendering took longer than {self._timeout_s:g} s (the limit)")
        return reply["job"]

    async def start(self) -> None:
        """Starts every worker (else each starts at its first render)."""
        await self.fast.start()
        if self.slow is not None:
            await self.slow.start()

    async def close(self) -> None:
        await self.fast.close()
        if self.slow is not None:
            await self.slow.close()
