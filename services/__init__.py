"""AGL services: ledger, proxy, controller, trainer, and the shared ledger client."""
