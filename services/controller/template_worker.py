"""Job templates rendered away from the controller's event loop, within time, memory and output-size limits.

A rollout's Jinja2 template is user input: even in the sandbox it can loop for minutes or allocate gigabytes.
Rendering runs in a few long-lived worker processes (`python -m services.controller.template_worker`) whose
address space is capped (RLIMIT_AS); the controller waits for each answer at most the time limit, then kills the
worker, starts a fresh one and fails only that rollout. The event loop only writes a request line and awaits the
answer line, and the other workers keep rendering while one is stuck on a hostile template.

Wire: one JSON object per line each way. Request {"template", "args" (render_job's keyword arguments)}; answer
{"job": manifest} or {"error": message}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import sys
from typing import Any

from .job_template import render_job
from .outcome import ConfigError

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 30.0


class TemplateWorker:
    """The controller's side: one worker process, one render at a time, restarted after a kill or a crash."""

    def __init__(self, *, timeout_s: float, memory_bytes: int, max_output_bytes: int) -> None:
        self._timeout_s = timeout_s
        self._memory_bytes = memory_bytes
        self._max_output = max_output_bytes
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.restarts = 0

    async def render(self, template: str, **args: Any) -> dict[str, Any]:
        """render_job(template, **args) in the worker. Raises ConfigError for a bad template or a broken limit."""
        line = json.dumps({"template": template, "args": {**args, "max_bytes": self._max_output}}) + "\n"
        async with self._lock:
            proc = await self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(line.encode())
                await proc.stdin.drain()
                answer = await asyncio.wait_for(proc.stdout.readline(), self._timeout_s)
            except TimeoutError:
                await self._stop("time limit")
                raise ConfigError(
                    f"invalid Job template: rendering took longer than {self._timeout_s:g} s (the limit)"
                ) from None
            except (ConnectionError, asyncio.LimitOverrunError, ValueError) as err:
                await self._stop(f"broken pipe: {err}")
                raise ConfigError(f"invalid Job template: the render worker failed ({err})") from None
            if not answer:
                await self._stop("exited")
                raise ConfigError(
                    "invalid Job template: rendering it was stopped at the memory limit "
                    f"({self._memory_bytes >> 20} MiB) or crashed the render worker"
                )
        reply = json.loads(answer)
        if "error" in reply:
            raise ConfigError(reply["error"])
        return reply["job"]

    async def close(self) -> None:
        async with self._lock:
            await self._stop("")

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        argv = [sys.executable, "-m", "services.controller.template_worker", str(self._memory_bytes)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,  # tracebacks of a crashed worker go to the controller's own log
            limit=4 * self._max_output + (1 << 20),  # the answer line: the manifest as JSON
        )
        return self._proc

    async def _stop(self, why: str) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if why:
            self.restarts += 1
            log.warning("template render worker (pid %d) stopped: %s; a fresh one renders the next template", proc.pid,
                        why)  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


class TemplateWorkers:
    """A few render workers, so a template that runs into the time limit holds up no other rollout's render."""

    def __init__(self, count: int, *, timeout_s: float, memory_bytes: int, max_output_bytes: int) -> None:
        self.workers = [
            TemplateWorker(timeout_s=timeout_s, memory_bytes=memory_bytes, max_output_bytes=max_output_bytes)
            for _ in range(max(1, count))
        ]
        self._idle: asyncio.Queue[TemplateWorker] | None = None

    async def render(self, template: str, **args: Any) -> dict[str, Any]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for worker in self.workers:
                self._idle.put_nowait(worker)
        worker = await self._idle.get()
        try:
            return await worker.render(template, **args)
        finally:
            self._idle.put_nowait(worker)

    async def close(self) -> None:
        await asyncio.gather(*(worker.close() for worker in self.workers))


def _plain(value: Any) -> Any:
    """YAML values JSON has no type for (dates, timestamps) as the Kubernetes client would send them."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} in the rendered Job cannot be sent to the API server")


def _serve(memory_bytes: int) -> None:
    """The worker's loop: read a request line, render, answer a line; exits when stdin closes."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    out = sys.stdout
    for line in sys.stdin:
        try:
            request = json.loads(line)
            job = render_job(request["template"], **request["args"])
            answer = json.dumps({"job": job}, default=_plain)
        except ConfigError as err:
            answer = json.dumps({"error": str(err)})
        except MemoryError:
            answer = json.dumps({"error": "invalid Job template: rendering it ran out of the memory limit"})
        except Exception as err:  # anything else about this template fails it, never the worker
            answer = json.dumps({"error": f"invalid Job template: {type(err).__name__}: {err}"})
        out.write(answer + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
