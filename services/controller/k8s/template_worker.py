"""One Job-template render worker process, and the controller's handle on it (template_lanes.py pools them).

A rollout's Jinja2 template is user input: even in the sandbox it can loop for minutes or allocate gigabytes. A
worker (`python -m services.controller.k8s.template_worker MEMORY_BYTES NICE`) renders away from the controller's event
loop, with its address space capped (RLIMIT_AS). Each render has a deadline the worker keeps itself (SIGALRM
interrupts the Jinja2 and YAML code, both pure Python), so a render that runs over it costs no restart; the
controller kills the worker only when no answer comes a moment after the deadline (a stall inside one C call).

Every answer is one line the controller can read whatever the template rendered: the rendered text is at most
max_bytes UTF-8 bytes, and the Job as JSON at most twice that (YAML aliases can make it far larger than the text);
over either the answer is a clear error, never an oversized line.

Wire: one JSON object per line each way. Request {"template", "args" (render_job's keyword arguments),
"deadline_s"}; answer {"job": manifest}, {"error": message} or {"overtime": true} (the deadline passed). The JSON is
UTF-8 with lone surrogates passed through (`surrogatepass`), so non-ASCII text costs its UTF-8 size, not 6 bytes a
character.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import sys
from typing import Any

from ..core.outcome import ConfigError
from .job_template import render_job

log = logging.getLogger(__name__)

# What the controller runs as a worker: this file (its main() below).
WORKER_MODULE = "services.controller.k8s.template_worker"

# After a render's deadline, how long the worker has to answer "overtime" before it is killed.
_KILL_GRACE_S = 1.0
_ENCODING = ("utf-8", "surrogatepass")
_MAX_ERROR_CHARS = 4000
_STARTUP_TIMEOUT_S = 30.0
_READY = b"ready\n"


def job_json_limit(max_output_bytes: int) -> int:
    """Most bytes of a rendered Job as JSON (twice the rendered text's limit: room for quoting and escapes)."""
    return 2 * max_output_bytes


class TemplateWorker:
    """The controller's side: one worker process, one render at a time, started again after a kill or a crash."""

    def __init__(self, *, memory_bytes: int, max_output_bytes: int, nice: int = 0) -> None:
        self._memory_bytes = memory_bytes
        self._max_output = max_output_bytes
        self._nice = nice
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()  # close() waits for a render under way
        self.restarts = 0

    async def render(self, template: str, args: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """The worker's answer: {"job": manifest}, {"overtime": True} past `deadline_s`, or raises ConfigError."""
        request = {"template": template, "args": {**args, "max_bytes": self._max_output}, "deadline_s": deadline_s}
        line = json.dumps(request).encode() + b"\n"
        async with self._lock:
            proc = await self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
                answer = await asyncio.wait_for(proc.stdout.readline(), deadline_s + _KILL_GRACE_S)
            except TimeoutError:
                await self._stop(f"no answer {_KILL_GRACE_S:g} s after the {deadline_s:g} s deadline")
                return {"overtime": True}
            except (ConnectionError, asyncio.LimitOverrunError, ValueError) as err:
                await self._stop(f"broken pipe: {err}")
                raise ConfigError(f"invalid Job template: the render worker failed ({err})") from None
            if not answer:
                await self._stop("exited")
                raise ConfigError(
                    "invalid Job template: rendering it was stopped at the memory limit "
                    f"({self._memory_bytes >> 20} MiB) or crashed the render worker"
                )
        reply = json.loads(answer.decode(*_ENCODING))
        if "error" in reply:
            raise ConfigError(reply["error"])
        return reply

    async def start(self) -> None:
        """Starts the process now, so the first render does not wait for an interpreter to start."""
        async with self._lock:
            await self._started()

    async def close(self) -> None:
        async with self._lock:
            await self._stop("")

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        argv = [sys.executable, "-m", WORKER_MODULE, str(self._memory_bytes), str(self._nice)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,  # tracebacks of a crashed worker go to the controller's own log
            # The longest answer the worker writes is a Job at its JSON limit; past it the pipe is broken.
            limit=job_json_limit(self._max_output) + (1 << 16),
        )
        # Deadlines count from the request: wait until the interpreter has started and imported what it renders with.
        assert self._proc.stdout is not None
        try:
            hello = await asyncio.wait_for(self._proc.stdout.readline(), _STARTUP_TIMEOUT_S)
        except TimeoutError:
            hello = b""
        if hello != _READY:
            await self._stop("did not start")
            raise ConfigError(f"no Job template render worker started within {_STARTUP_TIMEOUT_S:g} s")
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


# -- the worker process ---------------------------------------------------------------------------------------


class _Overtime(BaseException):
    """The render's deadline passed. A BaseException, so that no `except Exception` in Jinja2 or in render_text
    turns it into a template error."""


_armed = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _armed:  # an alarm that fires just after the render ended is ignored
        raise _Overtime


def _plain(value: Any) -> Any:
    """YAML values JSON has no type for (dates, timestamps) as the Kubernetes client would send them."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} in the rendered Job cannot be sent to the API server")


def _job_json(job: dict[str, Any], limit: int) -> str:
    """The Job as JSON, given up as soon as it grows over `limit` bytes (aliases can make it exponentially large)."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_plain)
    parts: list[str] = []
    size = 0
    for part in encoder.iterencode(job):
        size += len(part) if part.isascii() else len(part.encode(*_ENCODING))
        if size > limit:
            raise ConfigError(
                f"invalid Job template: the rendered Job is more than {limit} bytes as JSON (twice the "
                "rendered-text limit; YAML aliases expand there)"
            )
        parts.append(part)
    return "".join(parts)


def _answer(request: dict[str, Any]) -> str:
    global _armed
    args = request["args"]
    signal.setitimer(signal.ITIMER_REAL, max(request["deadline_s"], 0.001))
    _armed = True
    try:
        job = render_job(request["template"], **args)
        return '{"job":' + _job_json(job, job_json_limit(args["max_bytes"])) + "}"
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _error(message: str) -> str:
    """An error answer; a message quoting a huge part of the template is cut to a readable length."""
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + " …(cut)"
    return json.dumps({"error": message})


def _serve(memory_bytes: int, nice: int) -> None:
    """The worker's loop: read a request line, render, answer a line; exits when stdin closes."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if nice:
        os.nice(nice)  # renders of the slow lane leave the CPU to quick ones
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:
        try:
            answer = _answer(json.loads(line))
        except _Overtime:
            answer = '{"overtime":true}'
        except ConfigError as err:
            answer = _error(str(err))
        except MemoryError:
            answer = _error("invalid Job template: rendering it ran out of the memory limit")
        except Exception as err:  # anything else about this template fails it, never the worker
            answer = _error(f"invalid Job template: {type(err).__name__}: {err}")
        out.write(answer.encode(*_ENCODING) + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
