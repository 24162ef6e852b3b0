"""Whether the ledger answers the console, so its pages can say when what they show may be out of date.

The console's watches sit silent both when nothing changes and when the ledger hangs (a stopped process, a blocked
loop): only a call with a deadline tells the two apart. One cheap call (GetProxyControl) every `every_s`, with a
deadline of `deadline_s` and no retry, from a client of its own; each change of state is logged once and offered to
the open pages (topic "ledger").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.client import LedgerClient, LedgerError, Refused, RetryPolicy

log = logging.getLogger(__name__)


def deadline_s(every_s: float) -> float:
    """A check's deadline: most of the interval (the next check follows it), at least 1 s."""
    return max(1.0, 0.6 * every_s)


class LedgerCheck:
    def __init__(self, ledger: str, key: str | None, every_s: float, on_change: Callable[[], None]) -> None:
        self.ledger = ledger
        self.every_s = every_s
        self._client = LedgerClient(ledger, key, retry=RetryPolicy(attempts=1), call_timeout_s=deadline_s(every_s))
        self._on_change = on_change
        self._failure = ""  # "" while the last check was answered
        self._answered_at = time.monotonic()

    def problem(self) -> str:
        """One sentence for the pages, or "" while the ledger answers."""
        if not self._failure:
            return ""
        silent_s = time.monotonic() - self._answered_at
        return (
            f"The ledger at {self.ledger} has not answered the console for {silent_s:.0f} s ({self._failure}): "
            "what this page shows may be out of date."
        )

    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.every_s)

    async def check_once(self) -> None:
        try:
            await self._client.get_proxy_control()
        except LedgerError as err:
            failure = "it refuses the console's key" if isinstance(err, Refused) else err.code_name
            if failure != self._failure:
                log.warning("ledger at %s: %s; the pages say so until it answers", self.ledger, failure)
                self._failure = failure
                self._on_change()
            return
        self._answered_at = time.monotonic()
        if self._failure:
            log.info("ledger at %s answers the console again", self.ledger)
            self._failure = ""
            self._on_change()

    async def close(self) -> None:
        await self._client.close()
