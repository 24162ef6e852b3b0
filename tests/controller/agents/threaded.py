"""An agent module that starts a thread when imported: forking a process that imported it is unsafe."""

from __future__ import annotations

import threading
import time

_ticker = threading.Thread(target=lambda: time.sleep(3600), name="import-time-thread", daemon=True)
_ticker.start()


class ThreadedAgent:
    def run(self) -> None:
        print(f"threads alive: {threading.active_count()}")
