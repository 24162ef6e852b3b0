"""The pure path from a finished rollout to a training row: triplets, rows (aggregation), step health and its
guardrails, infrastructure failures, advantages, mini-batch alignment, the DataProto and the `per_rollout_mean`
loss. No I/O; `batch`, `advantage`, `loss` and `adapter` import verl and torch, the rest only the standard library."""
