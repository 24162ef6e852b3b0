"""An informer: list + watch + a local cache + `synced`, written once for every keyed watch of the ledger.

As Kubernetes' informers do for controllers: a watch of rollouts or runs starts with a snapshot and continues with
changes, each change naming one item; the informer keeps the items by key, tells its owner what changed, and sets
`synced` once the first snapshot is complete. The client's watch under it resumes by itself after a cut; when it
has to start over (the ledger no longer keeps its revision) the new snapshot replaces the cache whole, so an item
deleted meanwhile does not linger. The controller's queue and the console's mirror are informers.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services._gen.agl.v1 import ledger_service_pb2 as pb

T = TypeVar("T")


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How one watch's messages name their change and item."""

    snapshot: int
    synced: int
    upsert: int
    delete: int
    item: Callable[[Any], T]
    key: Callable[[T], str]


def _kind(resource: str, upsert: str) -> Kind[Any]:
    """The Kind of a watch whose change enum is `{RESOURCE}_CHANGE_TYPE_*` and whose item is in field `resource`,
    keyed by its `{resource}_id`."""
    change = {name: getattr(pb, f"{resource.upper()}_CHANGE_TYPE_{name}") for name in ("SNAPSHOT", "SYNCED", "DELETE")}
    upserted = getattr(pb, f"{resource.upper()}_CHANGE_TYPE_{upsert}")
    return Kind(change["SNAPSHOT"], change["SYNCED"], upserted, change["DELETE"], item=operator.attrgetter(resource),
                key=operator.attrgetter(f"{resource}_id"))  # fmt: skip


ROLLOUTS = _kind("rollout", "UPSERT")
RUNS = _kind("run", "RUN")  # its STEP changes (metrics of a step) leave the run itself unchanged


class Handler(Generic[T]):
    """What an informer's owner hears. Each method is called after the cache has changed."""

    def on_relist(self) -> None:
        """A new snapshot begins after one was complete: what the owner derived from the cache may be stale."""

    def on_snapshot_item(self, item: T) -> None:
        """An item of a snapshot, as it arrives (before the snapshot is complete and in the cache)."""

    def on_synced(self, replaced: bool) -> None:
        """A snapshot is complete; `replaced` says whether it replaced the cache (a resume without a new snapshot
        keeps the cache)."""

    def on_upsert(self, old: T | None, new: T) -> None:
        """An item was created or changed."""

    def on_delete(self, old: T | None, gone: T) -> None:
        """An item was deleted (`old` is what the cache held, if anything)."""


class Informer(Generic[T]):
    """Follows one watch into `items`. `run()` returns or raises as the watch does (a refused key, say).

    `keep` says which items belong in the cache: a watch filtered by state tells its watchers that an item left the
    filter by sending it changed, and the cache then lets it go (the handler still hears the upsert)."""

    def __init__(
        self,
        watch: Callable[[], AsyncIterator[Any]],
        kind: Kind[T],
        handler: Handler[T],
        keep: Callable[[T], bool] | None = None,
    ) -> None:
        self._watch = watch
        self._kind = kind
        self._handler = handler
        self._keep = keep
        self.items: dict[str, T] = {}
        self.synced = asyncio.Event()

    async def run(self) -> None:
        kind, handler = self._kind, self._handler
        snapshot: dict[str, T] = {}
        in_snapshot = False
        stream = self._watch()
        try:
            async for message in stream:
                change = message.type
                if change == kind.snapshot:
                    if not in_snapshot and self.synced.is_set():
                        handler.on_relist()
                    in_snapshot = True
                    item = kind.item(message)
                    snapshot[kind.key(item)] = item
                    handler.on_snapshot_item(item)
                elif change == kind.synced:
                    replaced = bool(snapshot) or not self.synced.is_set()
                    if replaced:
                        self.items, snapshot = snapshot, {}
                    in_snapshot = False
                    self.synced.set()
                    handler.on_synced(replaced)
                elif change == kind.upsert:
                    item = kind.item(message)
                    key = kind.key(item)
                    old = self.items.get(key)
                    if self._keep is None or self._keep(item):
                        self.items[key] = item
                    else:
                        self.items.pop(key, None)
                    handler.on_upsert(old, item)
                elif change == kind.delete:
                    item = kind.item(message)
                    handler.on_delete(self.items.pop(kind.key(item), None), item)
        finally:
            await stream.aclose()
