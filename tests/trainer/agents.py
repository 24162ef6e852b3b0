"""Agents for the CPU training tests, written like any Agent Lightning v1.0 agent (they read AGL_* only).

ParityAgent asks the model once and rewards the parity of its first answer character, plus a tie-break under
0.01 taken from its rollout id. Parity alone leaves a group of 4 scored alike about 15% of the time at the
base model's ~0.4 (and more once training sharpens it), and a step of such groups is skipped, so the tests'
"every step updates" would be luck; distinct rollouts always score apart. With `"mode": "zero"` in the task it
always posts 0: a group with no learning signal.
"""

from __future__ import annotations

import json
import os
import time
import zlib

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
        value = 0.0 if task.get("mode") == "zero" else ord(text[0]) % 2 + tie_break(os.environ["AGL_OPENAI_BASE_URL"])
        event = {"event_type": "reward", "data": {"value": value}}
        httpx.post(os.environ["AGL_EVENT_URL"], json=event, headers=headers).raise_for_status()


def tie_break(base_url: str) -> float:
    """A value in [0, 0.01) from the rollout id in the base URL (`.../proxy/rollout/<id>/attempt/...`)."""
    rollout_id = base_url.split("/rollout/", 1)[1].split("/", 1)[0]
    return zlib.crc32(rollout_id.encode()) % 1000 / 100_000


class PatientParityAgent:
    """ParityAgent as an agent written against the OpenAI SDK behaves when the services under it restart: the SDK
    retries a call that found no proxy or lost its connection (here up to 8 times, ~30 s of backoff), and the
    reward is posted again on a connection error or a 5xx."""

    def run(self) -> None:
        import openai

        key = os.environ.get("AGL_KEY", "")
        base_url = os.environ["AGL_OPENAI_BASE_URL"]
        task = json.loads(os.environ.get("AGL_TASK", "{}"))
        with openai.OpenAI(base_url=base_url, api_key=key or "none", max_retries=8, timeout=30) as sdk:
            reply = sdk.chat.completions.create(
                model="any", messages=[{"role": "user", "content": task.get("q", "?")}], max_tokens=4
            )
        text = reply.choices[0].message.content or " "
        value = 0.0 if task.get("mode") == "zero" else ord(text[0]) % 2 + tie_break(base_url)
        event = {"event_type": "reward", "data": {"value": value}}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for attempt in range(20):
            try:
                answer = httpx.post(os.environ["AGL_EVENT_URL"], json=event, headers=headers)
                if answer.status_code < 500:
                    answer.raise_for_status()
                    return
            except httpx.TransportError:
                pass
            time.sleep(min(0.25 * 2**attempt, 2.0))
        raise RuntimeError("the reward could not be posted")


class SpanningAgent:
    """ParityAgent over two calls when its task's mode is "span": the second call (the conversation so far and
    one more question) waits until the engine serves newer weights than the first call met, so the rollout's
    calls span a push; its task names the engine (`"engine": URL`) whose weight label it reads (vLLM's
    /weight_info). After 480 s without a push it calls anyway. Other modes: one call. A call
    the trainer's pause refuses (429, async mode's push) is sent again until the pause ends."""

    def run(self) -> None:
        task = json.loads(os.environ.get("AGL_TASK", "{}"))
        key = os.environ.get("AGL_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        base_url = os.environ["AGL_OPENAI_BASE_URL"]
        messages = [{"role": "user", "content": task.get("q", "?")}]

        def label() -> str:
            return str(httpx.get(f"{task['engine']}/weight_info").json()["weight_version"])

        def ask() -> str:
            body = {"model": "any", "messages": messages, "max_tokens": 4}
            until = time.monotonic() + 480  # a pause holds while the trainer updates: a minute or more on CPU
            while True:
                reply = httpx.post(f"{base_url}/chat/completions", json=body, headers=headers, timeout=60)
                if reply.status_code not in (429, 503) or time.monotonic() > until:
                    break
                time.sleep(0.1)
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]["content"] or " "

        if task.get("mode") == "span":
            first_label = label()
            messages += [{"role": "assistant", "content": ask()}, {"role": "user", "content": "and again?"}]
            deadline = time.monotonic() + 480  # under the test run's rollout timeout (600 s)
            while label() == first_label and time.monotonic() < deadline:
                time.sleep(0.1)
        text = ask()
        event = {"event_type": "reward", "data": {"value": ord(text[0]) % 2 + tie_break(base_url)}}
        httpx.post(os.environ["AGL_EVENT_URL"], json=event, headers=headers).raise_for_status()
