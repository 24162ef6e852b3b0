"""The ledger: single owner of rollouts, events, model endpoints and proxy control state.

`ledger.Ledger` is the pure core (no gRPC); `servicer` and `server` put it behind `agl.v1.LedgerService`.
"""
