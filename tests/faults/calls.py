"""Agents' model calls fired at the proxy from threads while a fault is injected, each with its answer and time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from tests.proxy.conftest import AUTH, MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 3 + 4?"}], "max_tokens": 8}


@dataclass
class Answer:
    rollout_id: str
    status: int  # 0: no HTTP answer (connection error or client timeout)
    seconds: float
    code: str = ""


def call_loop(
    proxy_url: str,
    rollouts: list[str],
    stop: threading.Event,
    client_timeout_s: float = 60.0,
    on_answer: Callable[[Answer], None] | None = None,
) -> list[Answer]:
    """One thread per rollout calling chat completions back to back until `stop`; every answer kept."""
    answers: list[Answer] = []
    lock = threading.Lock()

    def agent(rollout_id: str) -> None:
        url = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1/chat/completions"
        with httpx.Client(timeout=client_timeout_s, headers=AUTH) as http:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    reply = http.post(url, json=CHAT)
                    code = ""
                    if reply.status_code != 200:
                        code = str(reply.json().get("error", {}).get("code", ""))
                    answer = Answer(rollout_id, reply.status_code, time.monotonic() - started, code)
                except httpx.HTTPError as err:
                    answer = Answer(rollout_id, 0, time.monotonic() - started, type(err).__name__)
                with lock:
                    answers.append(answer)
                if on_answer is not None:
                    on_answer(answer)
                if answer.status != 200:
                    time.sleep(0.05)

    with ThreadPoolExecutor(len(rollouts)) as pool:
        for rollout_id in rollouts:
            pool.submit(agent, rollout_id)
    return answers
