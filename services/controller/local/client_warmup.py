"""Warm the HTTP client libraries an agent module imported, in the launcher, before any child is forked.

Importing `openai` is not the whole cost of an agent's first call: the SDK builds its request transforms and
pydantic validators, and its HTTP stack its connection machinery, on first use. A forked child that makes the
first call pays that again for every rollout (~20 ms of CPU for the math agent, as much as the rest of its
work). So the launcher makes one real call of each kind itself, through the libraries' default clients, to a
stand-in on loopback that it forks for the purpose and kills right after; the children inherit the warm caches.

Nothing of the agent runs, no network is used beyond 127.0.0.1, and every failure is ignored (a library that
could not be warmed is only slower). The stand-in is a forked process, not a thread: the launcher must have
one thread when it forks its agents. `--no-launcher-warm-clients` turns it off.

What it earns, measured on an agent that does a whole rollout (`bench/controller_bench.py --agent calc`: the
unmodified calc agent, a tool call and an answer through the proxy, a reward posted, bursts of 200 at concurrency
32 on two cores, three rounds alternated with the defaults): 32.7 rollouts/s with the warm-up, 28.0 without
(+17%); the agent process's CPU 46.6 ms a rollout with it, 56.1 ms without. Where agents do seconds of their
own work, the ~10 ms it saves per rollout is a smaller share; it is still CPU the node gets back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

WARM_KEY = "agl-launcher-warm-up"
_CHAT_COMPLETION = {
    "id": "chatcmpl-warm-up",
    "object": "chat.completion",
    "created": 0,
    "model": "warm-up",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "0"}, "finish_reason": "stop", "logprobs": None}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def _answer(path: str) -> bytes:
    return json.dumps(_CHAT_COMPLETION if path.endswith("/chat/completions") else {}).encode()


def _serve(listener: socket.socket, connections: int, deadline_s: float) -> None:
    """The stand-in (in a forked child): answers `connections` requests with canned JSON, then exits."""
    signal.alarm(max(1, int(deadline_s) + 1))  # never outlives the warm-up, whatever the parent does
    listener.settimeout(deadline_s)
    for _ in range(connections):
        conn, _addr = listener.accept()
        with conn:
            conn.settimeout(deadline_s)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
            payload = _answer(path)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )


def _warm_openai(base_url: str, timeout_s: float) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=WARM_KEY, max_retries=0, timeout=timeout_s)
    try:
        client.chat.completions.create(
            model="warm-up",
            messages=[{"role": "system", "content": "warm"}, {"role": "user", "content": "up"}],
            max_tokens=1,
        )
    finally:
        client.close()


def _warm_httpx(base_url: str, timeout_s: float) -> None:
    import httpx

    body = {"event_type": "warm-up", "data": {}}
    headers = {"Authorization": f"Bearer {WARM_KEY}"}
    httpx.post(f"{base_url}/events", json=body, headers=headers, timeout=timeout_s).raise_for_status()


# Warmed when the agent's module (or a preload) imported the library; in this order.
WARMERS: tuple[tuple[str, Callable[[str, float], None]], ...] = (("openai", _warm_openai), ("httpx", _warm_httpx))


def warm_http_clients(timeout_s: float = 5.0) -> list[str]:
    """Makes one call through each imported library of WARMERS to a loopback stand-in; returns those warmed."""
    wanted = [(name, warm) for name, warm in WARMERS if name in sys.modules]
    if not wanted:
        return []
    started = time.perf_counter()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(len(wanted))
        base_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        pid = os.fork()
        if pid == 0:  # the stand-in
            code = 0
            try:
                _serve(listener, len(wanted), timeout_s)
            except BaseException:
                code = 1
            os._exit(code)
    except OSError as err:
        listener.close()
        log.debug("no warm-up of %s: %s", ", ".join(n for n, _ in wanted), err)
        return []
    listener.close()  # the stand-in holds it now
    warmed: list[str] = []
    try:
        for name, warm in wanted:
            try:
                warm(base_url, timeout_s)
                warmed.append(name)
            except Exception as err:  # a library we could not warm is only slower in the children
                log.debug("warm-up call through %s failed: %s: %s", name, type(err).__name__, err)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    log.debug("warmed %s in %.0f ms", ", ".join(warmed) or "nothing", (time.perf_counter() - started) * 1000)
    return warmed
