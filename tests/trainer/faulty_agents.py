"""An agent that fails on purpose, one way per task (`"mode"` in its input), written like any v1.0 agent.

Modes: `ok` (asks the model once, posts a reward that differs between rollouts), `no_call` (posts a reward without
asking the model), `reward_first` (posts its reward, then asks), `no_reward` (asks, posts nothing), `crash` (asks,
then raises: a non-zero exit, the agent's own failure), `kill` / `kill_once` (asks, then announces itself in the
task's `"faults"` folder and waits there for the test's fault injector, which SIGKILLs it from outside, as the OOM
killer would; an agent it spares posts its reward), `bad_tool_call` (offers a calculator tool with too few tokens to
write the call out: the engine cannot parse the cut-off call), `template_break` (asks twice, the second time with its
first answer rewritten in the history: not a pure append, as a template that drops reasoning would do). A task's
`"lost_groups"` (rollout id prefixes) kills its rollouts of those groups by a signal, whatever the mode.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx

from tests.trainer.agents import tie_break


def _headers() -> dict[str, str]:
    key = os.environ.get("AGL_KEY", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def _chat(messages: list[dict], **extra) -> dict:
    body = {"model": "any", "messages": messages, "max_tokens": 4, **extra}
    reply = httpx.post(f"{os.environ['AGL_OPENAI_BASE_URL']}/chat/completions", json=body, headers=_headers())
    reply.raise_for_status()
    return reply.json()["choices"][0]["message"]


def _ask(question: str) -> str:
    return _chat([{"role": "user", "content": question}])["content"] or " "


def _reward(value: float) -> None:
    event = {"event_type": "reward", "data": {"value": value}}
    httpx.post(os.environ["AGL_EVENT_URL"], json=event, headers=_headers()).raise_for_status()


def _wait_for_the_injector(faults: Path) -> None:
    base = os.environ["AGL_OPENAI_BASE_URL"]
    rollout, attempt = base.split("/rollout/", 1)[1].split("/")[0], base.split("/attempt/", 1)[1].split("/")[0]
    marker = faults / f"{rollout}--{attempt}.json"
    info = {"rollout": rollout, "ns": os.readlink("/proc/self/ns/pid"), "pid": os.getpid()}
    marker.with_suffix(".tmp").write_text(json.dumps(info))
    marker.with_suffix(".tmp").rename(marker)
    deadline = time.monotonic() + 60
    while not marker.with_suffix(".spared").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the fault injector never came")
        time.sleep(0.05)


class FaultyAgent:
    def run(self) -> None:
        task = json.loads(os.environ.get("AGL_TASK", "{}"))
        rollout = os.environ["AGL_OPENAI_BASE_URL"].split("/rollout/", 1)[1].split("/")[0]
        if any(rollout.startswith(prefix) for prefix in task.get("lost_groups", [])):
            # Whatever its mode: its process dies by a signal on every attempt, as under an engine host lost for the
            # whole step (the controller reports KILLED).
            os.kill(os.getpid(), signal.SIGKILL)
        mode = task.get("mode", "ok")
        question = task.get("q", "?")
        if mode == "no_call":
            _reward(1.0)
            return
        if mode == "reward_first":
            _reward(0.5)
            _ask(question)
            return
        if mode == "bad_tool_call":
            _chat([{"role": "user", "content": "What is 12 + 7?"}], tools=[CALCULATOR], max_tokens=3)
            _reward(0.0)
            return
        if mode == "template_break":
            first = [{"role": "user", "content": question}]
            answer = _chat(first)
            rewritten = {"role": "assistant", "content": "(an earlier answer, summarised)"}
            _chat([*first, rewritten, {"role": "user", "content": f"Are you sure? {answer.get('content')}"}])
            _reward(0.25)
            return
        answer = _ask(question)
        if mode == "crash":
            raise ValueError(f"no answer to {question!r}")
        if mode in ("kill", "kill_once"):
            _wait_for_the_injector(Path(task["faults"]))
        if mode == "no_reward":
            return
        _reward(ord(answer[0]) % 2 + tie_break(os.environ["AGL_OPENAI_BASE_URL"]))
