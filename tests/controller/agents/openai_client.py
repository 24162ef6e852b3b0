"""An agent module that imports the OpenAI SDK at import, as most agents do (the launcher's client warm-up)."""

from __future__ import annotations

import json
import sys

import openai  # noqa: F401  (what the launcher imports once and warms)


class FirstCallAgent:
    """Says whether the SDK's chat resources, which a client's first chat call loads, were loaded when it started."""

    def run(self) -> None:
        print(json.dumps({"chat_loaded": "openai.resources.chat" in sys.modules}))
