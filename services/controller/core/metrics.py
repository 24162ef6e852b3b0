"""Prometheus metrics of the controller, on a registry of their own (served by __main__)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Claim to agent code running: milliseconds for a warm launch, around a second for a fresh interpreter.
_START_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # One family per fact: how many attempts started, and how (a Job, a forked or fresh agent class, a command);
        # launches per second is rate() of it.
        self.launched = Counter(
            "agl_controller_launched",
            "Attempts launched, by how: warm (forked by a launcher), fresh (a new interpreter running the agent "
            "class), command (the template's argv), job (a Kubernetes Job).",
            ["mode"],
            registry=self.registry,
        )
        self.running = Gauge("agl_controller_running", "Attempts running now.", registry=self.registry)
        # Successes are attempts_ended{reason="succeeded"} (a success always ends the rollout); final failures are
        # their own fact: an attempt that failed may be retried, and a bad config fails the rollout before any.
        self.rollouts_failed = Counter(
            "agl_controller_rollouts_failed",
            "Rollouts this controller ended as failed (no retry left, or refused before launch), by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.attempts_ended = Counter(
            "agl_controller_attempts_ended",
            "Attempts that ended, by outcome (succeeded or the failure kind) and attempt number (10: 10 or more).",
            ["reason", "attempt"],
            registry=self.registry,
        )
        self.retried = Counter(
            "agl_controller_attempts_retried",
            "Failed attempts the ledger put back in the queue under the rollout's retry policy, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.claim_conflicts = Counter(
            "agl_controller_claim_conflicts", "Claims lost to another controller.", registry=self.registry
        )
        self.takeovers = Counter(
            "agl_controller_takeovers",
            "Running rollouts taken over from a controller whose lease expired.",
            registry=self.registry,
        )
        self.launch_latency = Histogram(
            "agl_controller_launch_latency_seconds",
            "From the rollout's creation (enqueue) to its agent running.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.agent_start = Histogram(
            "agl_controller_agent_start_seconds",
            "From the claim to the agent's code running (its run() about to be called), by launch mode.",
            ["mode"],
            buckets=_START_BUCKETS,
            registry=self.registry,
        )
        self.launcher_restarts = Counter(
            "agl_controller_launcher_restarts",
            "Warm launchers started again after one died.",
            registry=self.registry,
        )
        self.launchers = Gauge("agl_controller_launchers", "Warm launcher processes running.", registry=self.registry)
