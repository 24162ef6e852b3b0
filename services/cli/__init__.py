"""`agl`: the operator's command line over the typed ledger client (no grpcurl needed)."""
