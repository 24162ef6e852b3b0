"""Math agent on the official `anthropic` SDK (the Messages API), with a calculator tool.

It knows nothing about AGL, like the other examples: it reads AGL_OPENAI_BASE_URL, AGL_EVENT_URL and AGL_KEY
(set by the launcher) and its task (AGL_TASK_QUESTION / AGL_TASK_ANSWER, from the rollout input through the
rollout's env_map). The model may call the `calculator` tool (run here, in-process) within MAX_TURNS; the final
answer is scored against AGL_TASK_ANSWER and the reward is posted to AGL_EVENT_URL. The proxy records each
Messages call as a `model_request` event whose `api` is `anthropic.messages`.

Run it as an agent class (`examples.anthropic_agent.agent:AnthropicMathAgent`, the repository root on
PYTHONPATH) or as a module (`python -m examples.anthropic_agent.agent`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anthropic

from examples.calc_agent.agent import CalculatorError, calculate, post_reward, score

# The proxy replaces the model name with the one it serves; any name works here.
MODEL = "policy"
MAX_TURNS = 6
SYSTEM_PROMPT = (
    "You solve arithmetic problems. Use the calculator tool for every computation, "
    "then reply with the final number only."
)
# A Messages API tool: a name, a description and a JSON schema for its input.
CALCULATOR_TOOL = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "For example: (3 + 4) * 5"}},
        "required": ["expression"],
    },
}


def anthropic_base_url(openai_base_url: str) -> str:
    """The Anthropic SDK's base URL for the proxy's rollout prefix.

    The proxy serves Messages beside chat completions, at `{AGL_OPENAI_BASE_URL}/messages` (…/openai/v1/messages);
    the SDK appends `/v1/messages` to its base URL, so the base URL is AGL_OPENAI_BASE_URL without its `/v1`.
    """
    return openai_base_url.rstrip("/").removesuffix("/v1")


def run_tool(name: str, tool_input: Any) -> tuple[str, bool]:
    """Runs one tool_use block: (its output, whether it failed); errors go back to the model as text."""
    if name != "calculator":
        return f"error: unknown tool {name!r}", True
    try:
        return calculate(str(tool_input["expression"])), False
    except (KeyError, TypeError, CalculatorError) as exc:
        return f"error: {exc}", True


class AnthropicMathAgent:
    """Talks with the model over the Messages API, running its calculator calls, until it gives a final answer."""

    def run(self) -> float:
        key = os.environ.get("AGL_KEY", "")
        question = os.environ["AGL_TASK_QUESTION"]
        expected = os.environ["AGL_TASK_ANSWER"]
        # The SDK sends the key as x-api-key, which the proxy takes like a bearer key.
        client = anthropic.Anthropic(
            base_url=anthropic_base_url(os.environ["AGL_OPENAI_BASE_URL"]), api_key=key or "EMPTY", max_retries=5
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        reply, tool_calls = "", 0
        for _ in range(MAX_TURNS):
            response = client.messages.create(
                model=MODEL, system=SYSTEM_PROMPT, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=128
            )
            uses = [block for block in response.content if block.type == "tool_use"]
            if response.stop_reason != "tool_use" or not uses:
                reply = "".join(block.text for block in response.content if block.type == "text")
                break
            # The assistant's turn goes back as it came (its text and tool_use blocks), then one user turn with a
            # tool_result block per tool_use.
            messages.append({"role": "assistant", "content": [block.model_dump() for block in response.content]})
            results = []
            for use in uses:
                output, failed = run_tool(use.name, use.input)
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": output, "is_error": failed})
                tool_calls += 1
            messages.append({"role": "user", "content": results})
        reward = score(reply, expected)
        message_text = f"expected {expected}, got {reply!r} after {tool_calls} tool call(s)"
        post_reward(os.environ["AGL_EVENT_URL"], key, reward, message=message_text, source="anthropic_agent")
        print(f"question={question!r} reply={reply!r} tool_calls={tool_calls} reward={reward}", file=sys.stderr)
        return reward


def main() -> int:
    AnthropicMathAgent().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
