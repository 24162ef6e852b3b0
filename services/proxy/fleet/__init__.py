"""The proxy among its replicas, through the ledger: pause, resume and drain coordinated across replicas,
readiness, and the ledger side of each call (rollout checks, appends, the models stream)."""
