"""What the controller is whatever runs the agents: the loop that claims rollouts and reports attempts, the Runner
interface it drives, outcomes, the lease, readiness, metrics and probes, and the pieces both runners share (the
agent's environment, agent_runner, returned rewards). Imports neither `local` nor `k8s`."""

from __future__ import annotations
