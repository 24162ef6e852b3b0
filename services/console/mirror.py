"""The console's view of the ledger, kept current by the ledger's watches (no polling).

One WatchRollouts (every state), one WatchRuns (runs only), WatchModels and WatchProxyControl feed an
in-memory mirror; pages render from it, and every change is offered to the open browsers' server-sent-event
queues as a small notice naming its topics ("rollouts", "rollout:ID", "runs", "run:ID", "models", "proxy").
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

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import model_pb2, proxy_control_pb2, rollout_pb2, run_pb2
from services.client import LedgerClient, LedgerError

from .ledger_check import LedgerCheck

log = logging.getLogger(__name__)

Notice = dict[str, Any]
QUEUE_LIMIT = 1000


class Mirror:
    def __init__(self, client: LedgerClient) -> None:
        self.client = client
        self.check: LedgerCheck | None = None  # set before start(); it reports to ledger_changed
        self.rollouts: dict[str, rollout_pb2.Rollout] = {}
        self.counts: collections.Counter[int] = collections.Counter()
        self.runs: dict[str, run_pb2.Run] = {}
        self.models: list[model_pb2.ModelEndpoint] = []
        self.proxy = proxy_control_pb2.ProxyControl()
        self.synced = {"rollouts": asyncio.Event(), "runs": asyncio.Event()}
        self.error: str = ""  # the last watch failure, shown on the pages until a watch works again
        self._listeners: set[asyncio.Queue[Notice | None]] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        for name, feed in (
            ("rollouts", self._follow_rollouts),
            ("runs", self._follow_runs),
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
        return {
            rollout_pb2.RolloutState.Name(s).removeprefix("ROLLOUT_STATE_").lower(): self.counts[s]
            for s in (1, 2, 3, 4)
        }

    # -- feeds -----------------------------------------------------------------------------------------------------

    async def _follow_rollouts(self) -> None:
        snapshot: dict[str, rollout_pb2.Rollout] = {}
        async with contextlib.aclosing(self.client.watch_rollouts()) as stream:
            async for message in stream:
                if message.type == pb.ROLLOUT_CHANGE_TYPE_SNAPSHOT:
                    snapshot[message.rollout.rollout_id] = message.rollout
                    continue
                if message.type == pb.ROLLOUT_CHANGE_TYPE_SYNCED:
                    if snapshot or not self.synced["rollouts"].is_set():
                        self.rollouts = snapshot
                        self.counts = collections.Counter(r.status.state for r in snapshot.values())
                        snapshot = {}
                    self.error = ""
                    self.synced["rollouts"].set()
                    self._notify({"topics": ["rollouts"], "counts": self.count_by_state()})
                    continue
                rollout = message.rollout
                old = (
                    self.rollouts.pop(rollout.rollout_id, None)
                    if message.type == pb.ROLLOUT_CHANGE_TYPE_DELETE
                    else (self.rollouts.get(rollout.rollout_id))
                )
                if old is not None:
                    self.counts[old.status.state] -= 1
                if message.type == pb.ROLLOUT_CHANGE_TYPE_UPSERT:
                    self.rollouts[rollout.rollout_id] = rollout
                    self.counts[rollout.status.state] += 1
                state = rollout_pb2.RolloutState.Name(rollout.status.state).removeprefix("ROLLOUT_STATE_").lower()
                run = rollout.metadata.labels.get("agl_run", "")
                topics = ["rollouts", f"rollout:{rollout.rollout_id}"] + ([f"run:{run}"] if run else [])
                self._notify(
                    {"topics": topics, "id": rollout.rollout_id, "state": state, "counts": self.count_by_state()}
                )

    async def _follow_runs(self) -> None:
        snapshot: dict[str, run_pb2.Run] = {}
        async with contextlib.aclosing(self.client.watch_runs()) as stream:
            async for message in stream:
                if message.type == pb.RUN_CHANGE_TYPE_SNAPSHOT:
                    snapshot[message.run.run_id] = message.run
                elif message.type == pb.RUN_CHANGE_TYPE_SYNCED:
                    if snapshot or not self.synced["runs"].is_set():
                        self.runs, snapshot = snapshot, {}
                    self.synced["runs"].set()
                    self._notify({"topics": ["runs"]})
                elif message.type == pb.RUN_CHANGE_TYPE_DELETE:
                    self.runs.pop(message.run.run_id, None)
                    self._notify({"topics": ["runs", f"run:{message.run.run_id}"]})
                elif message.type == pb.RUN_CHANGE_TYPE_RUN:
                    self.runs[message.run.run_id] = message.run
                    self._notify({"topics": ["runs", f"run:{message.run.run_id}"], "step": message.run.last_step})

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
