"""The routing tables of every registered model: a rollout is routed among the endpoints of the model it trains.

A rollout names its model with the label `agl_model` (the trainer sets it to its run's model name, which for a LoRA
run is the adapter's name on the engines); a rollout without the label goes to the proxy's own model
(`--model-name`), as every call did in Agent Lightning v1.0. A second model is thus a second registration in the
ledger and a label on its rollouts, not a second proxy.

Each model keeps its own table (routing.py): its endpoints, its newest version, its held-back engines. One engine
serving two runs' adapters is listed in both tables and is held back or released in each on its own account (the
engine check reads each model's adapter on it). A rollout naming a model nobody registered finds no endpoint: it is
never sent to another model's engines.

A rollout may also carry a role map (the label `agl_roles`, services/role_map.py): then each call goes by the model
name its request sends, to the policy the map names for it (the rollout's own model, another registered model, a
frozen one), and the call's record says which (ModelRequest.role). Without the label every call goes to the rollout's
own model whatever name it sends, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services import role_map
from services._gen.agl.v1 import event_pb2
from services.proxy.engines.routing import Endpoint, RoutingTable
from services.proxy.errors import ProxyError

# The rollout label naming the model its calls go to (services/trainer/rollouts/specs.py LABEL_MODEL sets it).
MODEL_LABEL = "agl_model"

ROLE_POLICY = event_pb2.MODEL_REQUEST_ROLE_POLICY
ROLE_OTHER_POLICY = event_pb2.MODEL_REQUEST_ROLE_OTHER_POLICY
ROLE_FROZEN = event_pb2.MODEL_REQUEST_ROLE_FROZEN


@dataclass(frozen=True)
class RolloutModels:
    """What a rollout's labels say about where its calls go: its own model and its role map."""

    model: str = ""  # its own model ("": the proxy's own)
    roles: role_map.RoleMap | None = None
    problem: str = ""  # a role map label that does not parse: every call of the rollout is refused with it

    def route(self, requested: str, own: str) -> tuple[str, int]:
        """The model a call whose request names `requested` goes to, and its ModelRequestRole; `own` is the
        rollout's own model. ProxyError when the map refuses the name or cannot be read."""
        if self.problem:
            raise ProxyError("role_map_invalid", f"This rollout's role map ({role_map.LABEL_ROLES}) is refused: "
                             f"{self.problem}.")  # fmt: skip
        if self.roles is None:
            return own, ROLE_POLICY
        try:
            role = self.roles.resolve(requested)
        except role_map.UnmappedModel as err:
            raise ProxyError("model_not_mapped", str(err)) from None
        if role is None:
            return own, ROLE_POLICY
        model = own if role.policy in (role_map.POLICY, own) else role.policy
        if role.frozen:
            return model, ROLE_FROZEN
        return model, ROLE_POLICY if model == own else ROLE_OTHER_POLICY


def requested_model(body: Mapping[str, object]) -> str:
    """The model name an agent's request sends (its `model`, in every API it speaks); "" when none."""
    value = body.get("model")
    return value if isinstance(value, str) else ""


def rollout_models(labels: Mapping[str, str]) -> RolloutModels:
    """Where a rollout's labels send its calls: its `agl_model` ("" when none: the proxy's own) and its role map."""
    model = labels.get(MODEL_LABEL, "")
    text = labels.get(role_map.LABEL_ROLES)
    if text is None:
        return RolloutModels(model)
    try:
        roles = role_map.from_label(text)
    except role_map.RoleMapError as err:
        return RolloutModels(model, problem=str(err))
    return RolloutModels(model, None if roles.empty else roles)


class ModelRoutes:
    def __init__(self, default_model: str) -> None:
        self.model_name = default_model
        self.revision = 0
        # Whether the tables are the registry as it is now: not before the first set is read, nor from a cut of the
        # registry stream (a ledger restart) to the next set; the registry may have changed meanwhile (a push
        # registering its new version), and a call routed on the old tables would be recorded at the old version.
        self.current = False
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
        self.current = True

    def lost(self) -> None:
        """The registry stream was cut: the tables stand until the next set, but may be behind it."""
        self.current = False

    def count(self) -> tuple[int, int, int]:
        """Endpoints, stale ones and held ones, over every model (one engine serving two models counts twice)."""
        tables = self._tables.values()
        return (
            sum(len(t.endpoints) for t in tables),
            sum(len(t.stale) for t in tables),
            sum(len(t.held) for t in tables),
        )
