"""An Agent Lightning-style agent: one model call through the proxy with the OpenAI SDK, then a reward.

It uses nothing but the injected variables (AGL_OPENAI_BASE_URL, AGL_EVENT_URL, AGL_KEY) and QUESTION,
which the rollout's env_map takes from its input.
"""

from __future__ import annotations

import os

import httpx
import openai


class RewardAgent:
    async def run(self) -> None:
        key = os.environ["AGL_KEY"]
        client = openai.AsyncOpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key, max_retries=0)
        try:
            reply = await client.chat.completions.create(
                model="whatever-the-agent-thinks",
                messages=[{"role": "user", "content": os.environ["QUESTION"]}],
                max_tokens=8,
            )
        finally:
            await client.close()
        answer = reply.choices[0].message.content or ""
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(
                os.environ["AGL_EVENT_URL"],
                json={"event_type": "reward", "data": {"value": 1.0, "message": answer[:50], "source": "test"}},
                headers={"Authorization": f"Bearer {key}"},
            )
            response.raise_for_status()
        print(f"answered {answer!r}; reward posted")
