"""The routing tables of every registered model: a rollout is routed among the endpoints of the model it trains.

A rollout names its model with the label `agl_model` (the trainer sets it to its run's model name, which for a LoRA
run is the adapter's name on the engines); a rollout without the label goes to the proxy's own model
(`--model-name`), as every call did in Agent Lightning v1.0. A second model is thus a second registration in the
ledger and a label on its rollouts, not a second proxy.

Each model keeps its own table (routing.py): its endpoints, its newest version, its held-back engines. One engine
serving two runs' adapters is listed in both tables and is held back or released in each on its own account (the
engine check reads each model's adapter on it). A rollout naming a model nobody registered finds no endpoint: it is
never sent to another model's engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.proxy.engines.routing import Endpoint, RoutingTable

# The rollout label naming the model its calls go to (services/trainer/rollouts/specs.py LABEL_MODEL sets it).
MODEL_LABEL = "agl_model"


def rollout_model(labels: Mapping[str, str]) -> str:
    """The model a rollout's labels name ("" when none: the proxy's own)."""
    return labels.get(MODEL_LABEL, "")


class ModelRoutes:
    def __init__(self, default_model: str) -> None:
        self.model_name = default_model
        self.revision = 0
        self._tables: dict[str, RoutingTable] = {default_model: RoutingTable(default_model)}

    def table(self, model: str = "") -> RoutingTable:
        """The routing table of `model` (the proxy's own for ""); an empty one for a model not registered."""
        name = model or self.model_name
        table = self._tables.get(name)
        return table if table is not None else RoutingTable(name)

    @property
    def tables(self) -> tuple[RoutingTable, ...]:
        """Every model's table, the proxy's own first, then by name."""
        return tuple(sorted(self._tables.values(), key=lambda t: (t.model_name != self.model_name, t.model_name)))

    def update(self, endpoints: Iterable[tuple[str, Endpoint]], revision: int = 0) -> None:
        """Replaces every table with the registry's whole set of (model name, endpoint); a table keeps its holds."""
        grouped: dict[str, list[Endpoint]] = {self.model_name: []}
        for model, endpoint in endpoints:
            grouped.setdefault(model, []).append(endpoint)
        tables: dict[str, RoutingTable] = {}
        for name, listed in grouped.items():
            table = self._tables.get(name) or RoutingTable(name)
            table.update(listed, revision)
            tables[name] = table
        self._tables = tables
        self.revision = revision

    def count(self) -> tuple[int, int, int]:
        """Endpoints, stale ones and held ones, over every model (one engine serving two models counts twice)."""
        tables = self._tables.values()
        return (
            sum(len(t.endpoints) for t in tables),
            sum(len(t.stale) for t in tables),
            sum(len(t.held) for t in tables),
        )
