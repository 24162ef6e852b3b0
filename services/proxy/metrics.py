"""Prometheus metrics of the proxy (served at /metrics on the proxy's own port)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# Agents choose their event types, so a type is a label value only if it is known or among the first few name-like
# ones seen; everything else is counted as OTHER_EVENT_TYPE (otherwise /metrics grows with every type an agent sends).
KNOWN_EVENT_TYPES = ("reward",)
MAX_EVENT_TYPE_LABELS = 32  # name-like types kept as labels, besides the known ones
OTHER_EVENT_TYPE = "other"
_NAME_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")


class EventTypeLabels:
    """The label value for an agent's event type: known types, then the first MAX_EVENT_TYPE_LABELS name-like
    ones (a letter, then letters, digits or `_.:-`, at most 64 characters), then OTHER_EVENT_TYPE."""

    def __init__(self, limit: int = MAX_EVENT_TYPE_LABELS) -> None:
        self._kept = set(KNOWN_EVENT_TYPES)
        self._room = limit

    def __call__(self, event_type: str) -> str:
        if event_type in self._kept:
            return event_type
        if self._room > 0 and event_type != OTHER_EVENT_TYPE and _NAME_LIKE.fullmatch(event_type):
            self._room -= 1
            self._kept.add(event_type)
            return event_type
        return OTHER_EVENT_TYPE


_READ_COUNTERS = {
    "engine_connections": ("agl_proxy_engine_connections_opened", "Connections opened to engines so far."),
    "append_batches": (
        "agl_proxy_ledger_append_batches",
        "AppendEvents requests sent to the ledger so far (concurrent appends share them).",
    ),
}


class _ReadCounters(Collector):
    """Counters whose values live elsewhere (the engine pool, the ledger gateway), exposed as counter families."""

    def __init__(self, counts: dict[str, float]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        for key, (name, documentation) in _READ_COUNTERS.items():
            yield CounterMetricFamily(name, documentation, value=self._counts[key])


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.calls = Counter(
            "agl_proxy_model_calls", "Model calls by api and outcome.", ["api", "outcome"], registry=self.registry
        )
        self.call_seconds = Histogram(
            "agl_proxy_model_call_seconds", "Model call latency.", ["api"], buckets=buckets, registry=self.registry
        )
        self.upstream_retries = Counter(
            "agl_proxy_upstream_retries", "Upstream attempts beyond the first.", registry=self.registry
        )
        self.rejected = Counter(
            "agl_proxy_rejected", "Requests refused, by error code.", ["code"], registry=self.registry
        )
        self.events = Counter(
            "agl_proxy_agent_events",
            f"Agent events appended, by type (known types, the first {MAX_EVENT_TYPE_LABELS} others, then "
            f"{OTHER_EVENT_TYPE!r}).",
            ["event_type"],
            registry=self.registry,
        )
        self.event_type_label = EventTypeLabels()
        self.ledger_append_seconds = Histogram(
            "agl_proxy_ledger_append_seconds",
            "Time to append and acknowledge one event.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=self.registry,
        )
        self.token_continuations = Counter(
            "agl_proxy_token_continuations",
            "Train calls continuing a turn of their rollout, by outcome: appended (the prompt already continued "
            "it), spliced (sent as the sampled tokens + new context), diverged (the history's text changed), "
            "unsupported (the engine has no render/generate endpoints), failed (an engine error; sent as usual).",
            ["outcome"],
            registry=self.registry,
        )
        self.in_flight = Gauge("agl_proxy_in_flight", "Model calls in flight on this replica.", registry=self.registry)
        self.paused = Gauge("agl_proxy_paused", "1 while the proxy is paused.", registry=self.registry)
        self.endpoints = Gauge("agl_proxy_endpoints", "Endpoints known for the model.", registry=self.registry)
        self.stale_endpoints = Gauge(
            "agl_proxy_stale_endpoints",
            "Endpoints held back from routing: registered at a model version below the highest (stale weights).",
            registry=self.registry,
        )
        self.held_endpoints = Gauge(
            "agl_proxy_held_endpoints",
            "Endpoints held back from routing by their engine's own state: labelled with other weights than "
            "registered (restarted), or refusing connections (engines/weight_check.py).",
            registry=self.registry,
        )
        # Counts kept by the engine pool and the ledger gateway themselves, read at each scrape (set_counts): they
        # only grow, so they are counters (`_total`), not gauges.
        self._read_counts = {"engine_connections": 0, "append_batches": 0}
        self.registry.register(_ReadCounters(self._read_counts))

    def set_counts(self, engine_connections: int, append_batches: int) -> None:
        """The engine pool's and the ledger gateway's own counts, as they stand at this scrape."""
        self._read_counts["engine_connections"] = engine_connections
        self._read_counts["append_batches"] = append_batches
