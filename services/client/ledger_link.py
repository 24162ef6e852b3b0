"""A service's view of its link to the ledger: answering, refusing the key, or not answering.

Every background ledger call of a service reports here (`succeeded()` or `failed(err)`), so its /readyz can say
why it is not ready and for how long. Each change of state is logged once, as one line, never once per retry; a
refused key is logged as the line that says what to fix (`refused_message`).
"""

from __future__ import annotations

import logging
import time

from .errors import LedgerError, Refused

OK = "ok"
UNREACHABLE = "ledger_unreachable"
REFUSED = "ledger_refused_key"
UNKNOWN = "not_synced"


def refused_message(ledger: str, details: str, service: str) -> str:
    """The one line for a refused key, naming the service ("proxy", "controller") and what to give it."""
    return (
        f"the ledger at {ledger} refused the {service}'s key ({details or 'UNAUTHENTICATED'}): "
        f"give the {service} the ledger's key (--key or AGL_KEY)"
    )


class LedgerLink:
    """The state of one service's ledger connection (`state`, `detail`, `since`), updated by every ledger call.

    `address_in_reason` names the ledger's address in `detail`; `refused_note` follows the refused-key log line;
    `log` is the service's own logger, so each line says which service wrote it.
    """

    def __init__(
        self,
        ledger: str,
        service: str,
        log: logging.Logger,
        *,
        address_in_reason: bool = False,
        refused_note: str = "",
    ) -> None:
        self.ledger = ledger
        self.service = service
        self._log = log
        self._refused_note = refused_note
        self._the_ledger = f"the ledger at {ledger}" if address_in_reason else "the ledger"
        self.state = UNKNOWN
        self.detail = f"no answer from {self._the_ledger} yet"
        self.since = time.monotonic()

    def succeeded(self) -> None:
        if self.state != OK:
            if self.state in (REFUSED, UNREACHABLE):
                self._log.info("ledger at %s answers again", self.ledger)
            self._set(OK, "")

    def failed(self, err: LedgerError) -> None:
        if isinstance(err, Refused):
            if self.state != REFUSED:
                self._log.error("%s%s", refused_message(self.ledger, err.message, self.service), self._refused_note)
            self._set(REFUSED, f"{self._the_ledger} refused the {self.service}'s key ({err.code_name})")
        else:
            if self.state != UNREACHABLE:
                self._log.warning("ledger at %s unreachable (%s); retrying with backoff", self.ledger, err.code_name)
            self._set(UNREACHABLE, f"{self._the_ledger} did not answer ({err.code_name})")

    def _set(self, state: str, detail: str) -> None:
        if state != self.state:
            self.since = time.monotonic()
        self.state = state
        self.detail = detail
