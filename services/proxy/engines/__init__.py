"""The inference engines behind the proxy: the per-model routing tables, the rollout -> endpoint choice, the
shared keep-alive pool and retries, and the check that holds back an engine serving the wrong weights."""
