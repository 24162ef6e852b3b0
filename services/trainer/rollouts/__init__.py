"""The trainer's rollout phase through the ledger (asyncio): the rollout manager, its terminal feed, the specs it
creates, its persisted state and the rewind of a resumed run, retention, user hooks and the task datasets."""
