"""An agent module whose import takes long (as one that imports torch on a busy machine): the warm launcher is
still importing it when the controller is told to stop."""

from __future__ import annotations

import time

time.sleep(20)


class SleepAgent:
    def run(self) -> None:
        time.sleep(30)
