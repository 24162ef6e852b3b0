"""Math agent on the OpenAI Responses API (`client.responses.create` of the official `openai` SDK), with a
calculator tool.

It knows nothing about AGL, like the other examples: it reads AGL_OPENAI_BASE_URL, AGL_EVENT_URL and AGL_KEY
(set by the launcher) and its task (AGL_TASK_QUESTION / AGL_TASK_ANSWER, from the rollout input through the
rollout's env_map). It keeps the conversation itself and sends the whole input every turn (`store=False`), as
the Codex CLI and the OpenAI Agents SDK can: the proxy keeps no responses. The model may call the `calculator`
function (run here, in-process) within MAX_TURNS; the final answer is scored against AGL_TASK_ANSWER and the
reward is posted to AGL_EVENT_URL. The proxy records each call as a `model_request` event whose `api` is
`openai.responses`.

Run it as an agent class (`examples.responses_agent.agent:ResponsesMathAgent`, the repository root on
PYTHONPATH) or as a module (`python -m examples.responses_agent.agent`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from openai import OpenAI

from examples.calc_agent.agent import post_reward, run_tool, score

# The proxy replaces the model name with the one it serves; any name works here.
MODEL = "policy"
MAX_TURNS = 6
SYSTEM_PROMPT = (
    "You solve arithmetic problems. Use the calculator tool for every computation, "
    "then reply with the final number only."
)
# A Responses API function tool: flat (name, description, parameters at the top level, unlike chat's tools).
CALCULATOR_TOOL = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "For example: (3 + 4) * 5"}},
        "required": ["expression"],
    },
}


class ResponsesMathAgent:
    """Talks with the model over the Responses API, running its calculator calls, until it gives a final answer."""

    def run(self) -> float:
        key = os.environ.get("AGL_KEY", "")
        question = os.environ["AGL_TASK_QUESTION"]
        expected = os.environ["AGL_TASK_ANSWER"]
        # The proxy serves Responses beside chat completions: the OpenAI base URL is the one to use.
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key or "EMPTY", max_retries=5)
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": question}]
        reply, tool_calls = "", 0
        for _ in range(MAX_TURNS):
            response = client.responses.create(
                model=MODEL,
                instructions=SYSTEM_PROMPT,
                input=items,
                tools=[CALCULATOR_TOOL],
                max_output_tokens=128,
                store=False,
            )
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                reply = response.output_text
                break
            # The model's function calls go back as input items, each followed by its output.
            for call in calls:
                items.append(
                    {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
                )
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": run_tool(call.name, call.arguments),
                    }
                )
                tool_calls += 1
        reward = score(reply, expected)
        message_text = f"expected {expected}, got {reply!r} after {tool_calls} tool call(s)"
        post_reward(os.environ["AGL_EVENT_URL"], key, reward, message=message_text, source="responses_agent")
        print(f"question={question!r} reply={reply!r} tool_calls={tool_calls} reward={reward}", file=sys.stderr)
        return reward


def main() -> int:
    ResponsesMathAgent().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
