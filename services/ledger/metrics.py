"""Prometheus metrics: read from the core's counters at scrape time (nothing on the hot path) plus the store's
commit latency."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .attempts import reason_name
from .ledger import Ledger
from .quotas import LIMITS
from .states import TRANSITIONS, state_name


class LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        ledger = self._ledger
        rollouts = GaugeMetricFamily("agl_ledger_rollouts", "Stored rollouts by state.", labels=["state"])
        for state in TRANSITIONS:
            rollouts.add_metric([state_name(state)], ledger.state_counts[state])
        yield rollouts
        retried = CounterMetricFamily(
            "agl_ledger_attempts_retried", "Failed attempts put back in the queue, by reason.", labels=["reason"]
        )
        for reason, count in sorted(ledger.retries.items()):
            retried.add_metric([reason_name(reason)], count)
        yield retried
        yield CounterMetricFamily("agl_ledger_events_appended", "Events appended.", value=ledger.events_appended)
        refused = CounterMetricFamily(
            "agl_ledger_appends_refused",
            "Appends refused over a per-rollout limit, by limit (a merged request the client then sends again in "
            "parts counts once for each refusal).",
            labels=["limit"],
        )
        for limit in LIMITS:
            refused.add_metric([limit], ledger.quota_refusals[limit])
        yield refused
        streams = GaugeMetricFamily("agl_ledger_stream_subscribers", "Open server streams by feed.", labels=["feed"])
        for feed in ("rollouts", "terminal", "models", "proxy_control"):
            streams.add_metric([feed], ledger.stream_counts[feed])
        yield streams
        yield GaugeMetricFamily("agl_ledger_revision", "Ledger revision (rollout changes).", value=ledger.revision)
        yield GaugeMetricFamily("agl_ledger_runs", "Stored training runs.", value=len(ledger.runs.runs))
        yield GaugeMetricFamily("agl_ledger_run_watchers", "Open WatchRuns streams.", value=ledger.runs.watchers)
        yield GaugeMetricFamily(
            "agl_ledger_terminal_cursor", "Last terminal-log cursor.", value=ledger.terminal.last_cursor
        )


def build_registry(ledger: Ledger) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(LedgerCollector(ledger))
    commit_seconds = Histogram(
        "agl_ledger_store_commit_seconds",
        "Duration of one store commit (a group of writes made durable together).",
        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        registry=registry,
    )
    commit_ops = Histogram(
        "agl_ledger_store_commit_operations",
        "Operations per store commit (group-commit batch size).",
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192),
        registry=registry,
    )

    def observe(seconds: float, operations: int) -> None:
        commit_seconds.observe(seconds)
        commit_ops.observe(operations)

    ledger.store.commit_observer = observe
    return registry
