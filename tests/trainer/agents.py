"""Agents for the CPU training tests, written like any Agent Lightning v1.0 agent (they read AGL_* only).

ParityAgent asks the model once and rewards the parity of its first answer character: a random model gets
both rewards, so every GRPO group has an advantage to learn from. With `"mode": "zero"` in the task it
always posts 0: a group with no learning signal.
"""

from __future__ import annotations

import json
import os

import httpx


class ParityAgent:
    def run(self) -> None:
        key = os.environ.get("AGL_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        task = json.loads(os.environ.get("AGL_TASK", "{}"))
        body = {"model": "any", "messages": [{"role": "user", "content": task.get("q", "?")}], "max_tokens": 4}
        reply = httpx.post(f"{os.environ['AGL_OPENAI_BASE_URL']}/chat/completions", json=body, headers=headers)
        reply.raise_for_status()
        text = reply.json()["choices"][0]["message"]["content"] or " "
        value = 0.0 if task.get("mode") == "zero" else float(ord(text[0]) % 2)
        event = {"event_type": "reward", "data": {"value": value}}
        httpx.post(os.environ["AGL_EVENT_URL"], json=event, headers=headers).raise_for_status()
