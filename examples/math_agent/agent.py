"""Single-turn math agent, written the way Agent Lightning v1.0 agents are.

It knows nothing about AGL. It reads the OpenAI base URL, the event URL and the key the launcher injects,
plus its task (AGL_TASK_QUESTION / AGL_TASK_ANSWER, filled from the rollout input through the rollout's
env_map), asks the model once with the official `openai` SDK and posts its reward:

    {"event_type": "reward", "data": {"value": 1.0}}

Run it as a script (`python examples/math_agent/agent.py`) or as an agent class
(`agent_class: "agent:MathAgent"` with this folder on PYTHONPATH).
"""

from __future__ import annotations

import os
import re
import sys

import httpx
from openai import OpenAI

# The proxy replaces the model name with the one it serves; any name works here.
MODEL = "policy"
SYSTEM_PROMPT = "You are a careful calculator. Answer with the final number only."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in text, or None when there is none."""
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def score(reply: str, expected: str) -> float:
    """1.0 when the reply's last number equals the expected answer, else 0.0."""
    got, want = last_number(reply), last_number(expected)
    if got is None or want is None:
        return 0.0
    return 1.0 if abs(got - want) <= 1e-6 * max(1.0, abs(want)) else 0.0


def post_reward(event_url: str, key: str, value: float, message: str = "") -> None:
    """Posts the reward event; raises when the proxy does not accept it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"event_type": "reward", "data": {"value": value, "message": message, "source": "math_agent"}}
    response = httpx.post(event_url, json=body, headers=headers, timeout=30.0)
    response.raise_for_status()


class MathAgent:
    """Asks the model one question and rewards an exactly right final number."""

    def run(self) -> float:
        key = os.environ.get("AGL_KEY", "")
        question = os.environ["AGL_TASK_QUESTION"]
        expected = os.environ["AGL_TASK_ANSWER"]
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key or "EMPTY", max_retries=5)
        completion = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            max_tokens=64,
        )
        reply = completion.choices[0].message.content or ""
        reward = score(reply, expected)
        post_reward(os.environ["AGL_EVENT_URL"], key, reward, message=f"expected {expected}, got {reply!r}")
        print(f"question={question!r} reply={reply!r} reward={reward}", file=sys.stderr)
        return reward


def main() -> int:
    MathAgent().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
