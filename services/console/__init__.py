"""`agl-console`: a web console over the ledger (overview, runs with charts, rollouts, one rollout), live by SSE."""
