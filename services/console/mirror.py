"""The console's view of the ledger, kept current by the ledger's watches (no polling).

One WatchRollouts (every state), one WatchRuns (runs only), WatchModels and WatchProxyControl feed an
in-memory mirror; pages render from it, and every change is offered to the open browsers' server-sent-event
queues as a small notice naming its topics ("rollouts", "rollout:ID", "runs", "run:ID", "models", "proxy").
Rollouts and runs are kept by the client's informers (list + watch + cache + synced, services/client/informer.py).
At idle the console holds four open streams and sends the ledger one cheap call every few seconds (ledger_check: a
hung ledger sends nothing either). A browser queue that fills is
dropped (its page reconnects and re-renders).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from services._gen.agl.v1 import model_pb2, proxy_control_pb2, rollout_pb2, run_pb2
from services.client import ROLLOUTS, RUNS, Handler, Informer, LedgerClient, LedgerError

from .ledger_check import LedgerCheck

log = logging.getLogger(__name__)

Notice = dict[str, Any]
QUEUE_LIMIT = 1000


class Mirror:
    def __init__(self, client: LedgerClient) -> None:
        self.client = client
        self.check: LedgerCheck | None = None  # set before start(); it reports to ledger_changed
        self.counts: collections.Counter[int] = collections.Counter()
        # One informer per keyed watch, kept across restarts of its watch: the pages show the last complete
        # snapshot until a new one replaces it.
        self._rollouts: Informer[rollout_pb2.Rollout] = Informer(client.watch_rollouts, ROLLOUTS, _RolloutNews(self))
        self._runs: Informer[run_pb2.Run] = Informer(client.watch_runs, RUNS, _RunNews(self))
        self.models: list[model_pb2.ModelEndpoint] = []
        self.proxy = proxy_control_pb2.ProxyControl()
        self.synced = {"rollouts": asyncio.Event(), "runs": asyncio.Event()}
        self.error: str = ""  # the last watch failure, shown on the pages until a watch works again
        self._listeners: set[asyncio.Queue[Notice | None]] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        for name, feed in (
            ("rollouts", self._rollouts.run),
            ("runs", self._runs.run),
            ("models", self._follow_models),
            ("proxy", self._follow_proxy),
        ):
            self._tasks.append(asyncio.create_task(self._forever(name, feed), name=f"console-watch-{name}"))
        if self.check is not None:
            self._tasks.append(asyncio.create_task(self.check.run(), name="console-ledger-check"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.check is not None:
            await self.check.close()
        self.end_streams()

    @property
    def rollouts(self) -> dict[str, rollout_pb2.Rollout]:
        return self._rollouts.items

    @property
    def runs(self) -> dict[str, run_pb2.Run]:
        return self._runs.items

    def ledger_problem(self) -> str:
        """What the pages say about the ledger: "" while it answers the console's checks."""
        return self.check.problem() if self.check is not None else ""

    def ledger_changed(self) -> None:
        """The ledger check changed state: every open page shows, or stops showing, its line."""
        self._notify({"topics": ["ledger"]})

    def end_streams(self) -> None:
        """End every open browser event stream (shutdown: the pages reconnect to whoever serves next)."""
        for queue in list(self._listeners):
            self._listeners.discard(queue)
            with contextlib.suppress(asyncio.QueueEmpty):
                while queue.full():
                    queue.get_nowait()
            queue.put_nowait(None)

    async def _forever(self, name: str, feed: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """The client's watches reconnect by themselves; this restarts one that gave up (e.g. a refused key)."""
        while True:
            try:
                await feed()
            except asyncio.CancelledError:
                raise
            except LedgerError as err:
                self.error = f"{name} watch: {err.code_name}: {err.details()}"
                log.warning("console %s", self.error)
            except Exception as exc:
                self.error = f"{name} watch: {type(exc).__name__}: {exc}"
                log.exception("console %s watch failed", name)
            await asyncio.sleep(2.0)

    # -- browsers --------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[Notice | None]]:
        queue: asyncio.Queue[Notice | None] = asyncio.Queue(QUEUE_LIMIT)
        self._listeners.add(queue)
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    @property
    def listener_count(self) -> int:
        return len(self._listeners)

    def _notify(self, notice: Notice) -> None:
        for queue in list(self._listeners):
            try:
                queue.put_nowait(notice)
            except asyncio.QueueFull:
                self._listeners.discard(queue)
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(None)  # the page reconnects

    def count_by_state(self) -> dict[str, int]:
        return {_state_name(s): self.counts[s] for s in (1, 2, 3, 4)}

    # -- feeds -----------------------------------------------------------------------------------------------------

    async def _follow_models(self) -> None:
        async with contextlib.aclosing(self.client.watch_models()) as stream:
            async for message in stream:
                self.models = list(message.endpoints)
                self._notify({"topics": ["models"]})

    async def _follow_proxy(self) -> None:
        async with contextlib.aclosing(self.client.watch_proxy_control()) as stream:
            async for control in stream:
                self.proxy = control
                self._notify({"topics": ["proxy"]})


def _state_name(state: int) -> str:
    return rollout_pb2.RolloutState.Name(state).removeprefix("ROLLOUT_STATE_").lower()


class _RolloutNews(Handler[rollout_pb2.Rollout]):
    """Keeps the counts by state and tells the browsers what changed."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror

    def on_synced(self, replaced: bool) -> None:
        mirror = self._mirror
        if replaced:
            mirror.counts = collections.Counter(r.status.state for r in mirror.rollouts.values())
        mirror.error = ""
        mirror.synced["rollouts"].set()
        mirror._notify({"topics": ["rollouts"], "counts": mirror.count_by_state()})

    def on_upsert(self, old: rollout_pb2.Rollout | None, new: rollout_pb2.Rollout) -> None:
        if old is not None:
            self._mirror.counts[old.status.state] -= 1
        self._mirror.counts[new.status.state] += 1
        self._changed(new)

    def on_delete(self, old: rollout_pb2.Rollout | None, gone: rollout_pb2.Rollout) -> None:
        if old is not None:
            self._mirror.counts[old.status.state] -= 1
        self._changed(gone)

    def _changed(self, rollout: rollout_pb2.Rollout) -> None:
        run = rollout.metadata.labels.get("agl_run", "")
        topics = ["rollouts", f"rollout:{rollout.rollout_id}"] + ([f"run:{run}"] if run else [])
        counts = self._mirror.count_by_state()
        state = _state_name(rollout.status.state)
        self._mirror._notify({"topics": topics, "id": rollout.rollout_id, "state": state, "counts": counts})


class _RunNews(Handler[run_pb2.Run]):
    """Tells the browsers which runs changed."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror

    def on_synced(self, replaced: bool) -> None:
        self._mirror.synced["runs"].set()
        self._mirror._notify({"topics": ["runs"]})

    def on_upsert(self, old: run_pb2.Run | None, new: run_pb2.Run) -> None:
        self._mirror._notify({"topics": ["runs", f"run:{new.run_id}"], "step": new.last_step})

    def on_delete(self, old: run_pb2.Run | None, gone: run_pb2.Run) -> None:
        self._mirror._notify({"topics": ["runs", f"run:{gone.run_id}"]})
