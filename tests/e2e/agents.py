"""Agents that misbehave on purpose, for the end-to-end tests (run by the controller like any agent class)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from openai import OpenAI


class CrashingAgent:
    """Makes one model call, then fails before posting a reward."""

    def run(self) -> None:
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "What is 2 + 2?"}])
        raise RuntimeError("the agent gives up on purpose")


class SleepyAgent:
    """Writes its pid where AGL_TASK_PIDFILE says, then sleeps far past any test timeout."""

    def run(self) -> None:
        pid_file = Path(os.environ["AGL_TASK_PIDFILE"])
        partial = pid_file.with_name(pid_file.name + ".partial")
        partial.write_text(str(os.getpid()))
        os.replace(partial, pid_file)  # whole or not there: a reader never sees it empty
        time.sleep(300)
