"""Run control around the training loop: weights pushed to the engines, the proxies drained around an update, the
run's progress in the ledger, the trajectory log, the best validated weights, LoRA paths, and the Ray cluster dying
with its driver."""
