"""What the proxy knows about its ledger, for /readyz and for the one clear line a refused key deserves.

Liveness (/healthz) only says the process answers. Readiness says the proxy can do its work: its last contact with
the ledger succeeded and it has seen the model registry. Every background call to the ledger (heartbeat, the models
and control streams) reports here, so a ledger that goes away or starts refusing the key turns /readyz to 503 within
one heartbeat, one that hangs within a heartbeat and the report's deadline (coordination.report_timeout_s), and back
to 200 on the next success. A refused key is logged once per change of state, as one line
that says what to fix, not as a traceback per retry.
"""

from __future__ import annotations

import logging
import time

from services.client import LedgerClient, LedgerError, LedgerLink, Refused, RetryPolicy, refused_message
from services.client.ledger_link import OK

log = logging.getLogger(__name__)


class Readiness(LedgerLink):
    """The state of the proxy's ledger connection, updated by every background ledger call."""

    def __init__(self, ledger: str) -> None:
        super().__init__(ledger, "proxy", log)
        self.models_seen = False

    @property
    def ready(self) -> bool:
        return self.state == OK and self.models_seen

    def describe(self) -> dict[str, object]:
        reason = self.detail if self.state != OK else ("" if self.models_seen else "model registry not seen yet")
        return {
            "ready": self.ready,
            "ledger": self.state,
            "reason": reason,
            "for_seconds": round(time.monotonic() - self.since, 3),
        }


async def key_refused_at_start(ledger: str, key: str | None, timeout_s: float = 5.0) -> str | None:
    """One cheap ledger call before serving: the message to exit with if the ledger refuses the key, else None.

    A ledger that does not answer yet is not a reason to exit (the proxy serves, not ready, and keeps trying)."""
    async with LedgerClient(ledger, key, retry=RetryPolicy(attempts=1), call_timeout_s=timeout_s) as client:
        try:
            await client.get_proxy_control()
        except Refused as err:
            return refused_message(ledger, err.message, "proxy")
        except LedgerError as err:
            log.warning("ledger at %s not answering at start (%s); serving, not ready", ledger, err.code_name)
    return None
