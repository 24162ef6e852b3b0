"""What the controller knows about its ledger, for /readyz, and the one line a refused key deserves.

Liveness (/healthz) only says the process answers. Readiness says the controller can do its work: its last contact
with the ledger succeeded (a cheap call every `interval_s`, and every call of the queue watch) and it is subscribed to
the queue (the queuing watch delivered its snapshot). A ledger that goes away or starts refusing the key turns /readyz
to 503 within one interval, with a reason naming the ledger's address; it turns back to 200 on the next success. A
refused key is logged once per change of state, as one line that says what to fix, never a traceback per retry.
A key refused at start is fixed by the operator, not by retrying: the controller exits (like the proxy).
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.client import LedgerClient, LedgerError, LedgerLink, Refused, RetryPolicy, refused_message
from services.client.ledger_link import OK

log = logging.getLogger(__name__)


class Readiness(LedgerLink):
    """The controller's ledger connection and queue subscription, updated by every background ledger call."""

    def __init__(self, ledger: str) -> None:
        super().__init__(ledger, "controller", log, address_in_reason=True, refused_note="; retrying with backoff")
        self.subscribed = False

    @property
    def ready(self) -> bool:
        return self.state == OK and self.subscribed

    def describe(self) -> dict[str, object]:
        """The /readyz body (read from the HTTP server's thread: plain attribute reads)."""
        state, subscribed = self.state, self.subscribed
        if state != OK:
            reason = self.detail
        else:
            reason = "" if subscribed else f"not subscribed to the queue of the ledger at {self.ledger} yet"
        return {
            "ready": state == OK and subscribed,
            "ledger": state,
            "ledger_address": self.ledger,
            "subscribed": subscribed,
            "reason": reason,
            "for_seconds": round(time.monotonic() - self.since, 3),
        }


async def follow_ledger(client: LedgerClient, readiness: Readiness, interval_s: float) -> None:
    """Forever: one cheap call every interval_s (its own client: one try, a short deadline), reported to readiness."""
    while True:
        try:
            await client.get_proxy_control()
        except LedgerError as err:
            readiness.failed(err)
        else:
            readiness.succeeded()
        await asyncio.sleep(interval_s)


def probe_client(ledger: str, key: str | None, timeout_s: float) -> LedgerClient:
    return LedgerClient(ledger, key, retry=RetryPolicy(attempts=1), call_timeout_s=timeout_s)


async def key_refused_at_start(ledger: str, key: str | None, timeout_s: float = 5.0) -> str | None:
    """One call before anything starts: the message to exit with if the ledger refuses the key, else None.

    A ledger that does not answer yet is not a reason to exit (the controller waits, not ready, and keeps trying)."""
    async with probe_client(ledger, key, timeout_s) as client:
        try:
            await client.get_proxy_control()
        except Refused as err:
            return refused_message(ledger, err.message, "controller")
        except LedgerError as err:
            log.warning("ledger at %s not answering at start (%s); waiting for it, not ready", ledger, err.code_name)
    return None
