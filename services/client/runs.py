"""Typed client methods for training runs and their step metrics (mixed into LedgerClient).

Creating a run is idempotent (an existing run id returns the stored run), and a step reported again merges its
metrics into the stored ones, so every call here is safe to retry. `watch_runs` reconnects by itself and resumes
from the last revision it delivered; when the ledger no longer keeps it, it starts over with a fresh snapshot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any, Protocol

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, run_pb2

from .resumable import revision_watch
from .retry import RetryPolicy


class RunHost(Protocol):
    """What the run methods use of the client they are mixed into (LedgerClient): its unary call with retries, its
    paging, its stub, the call metadata and the retry policy."""

    _metadata: tuple[tuple[str, str], ...] | None
    _retry: RetryPolicy

    def _unary(self, method: str, request: Any, timeout_s: float | None = None) -> Awaitable[Any]: ...

    def _every_page(self, method: str, request: Any, items: str) -> Awaitable[list[Any]]: ...

    @property
    def stub(self) -> ledger_service_pb2_grpc.LedgerServiceStub: ...


class RunMethods:
    """The run RPCs of LedgerClient, kept beside each other; each takes the client as a RunHost."""

    async def create_run(
        self: RunHost, run_id: str, labels: Mapping[str, str] | None = None, config_json: str = ""
    ) -> tuple[run_pb2.Run, bool]:
        """Creates the run, or returns the stored one unchanged; the flag says whether it was created."""
        request = pb.CreateRunRequest(run_id=run_id, labels=dict(labels or {}), config_json=config_json)
        response = await self._unary("CreateRun", request)
        return response.run, response.created

    async def get_run(self: RunHost, run_id: str) -> run_pb2.Run:
        return (await self._unary("GetRun", pb.GetRunRequest(run_id=run_id))).run

    async def update_run_state(self: RunHost, run_id: str, state: int, error_message: str = "") -> run_pb2.Run:
        request = pb.UpdateRunStateRequest(run_id=run_id, state=state, error_message=error_message)
        return (await self._unary("UpdateRunState", request)).run

    async def delete_runs(self: RunHost, run_ids: Iterable[str]) -> int:
        return (await self._unary("DeleteRuns", pb.DeleteRunsRequest(run_ids=list(run_ids)))).deleted_count

    async def report_run_steps(
        self: RunHost, run_id: str, steps: Mapping[int, Mapping[str, float]]
    ) -> tuple[list[run_pb2.RunStep], run_pb2.Run]:
        """Stores {step: {metric: value}} (merged into what the steps had); values must be finite."""
        request = pb.ReportRunStepsRequest(
            run_id=run_id, steps=[run_pb2.RunStep(step=step, metrics=dict(m)) for step, m in steps.items()]
        )
        response = await self._unary("ReportRunSteps", request)
        return list(response.steps), response.run

    async def list_runs_page(
        self: RunHost,
        labels: Mapping[str, str] | None = None,
        states: Iterable[int] = (),
        page_size: int = 100,
        page_token: str = "",
    ) -> pb.ListRunsResponse:
        request = pb.ListRunsRequest(
            label_selector=dict(labels or {}), states=list(states), page_size=page_size, page_token=page_token
        )
        return await self._unary("ListRuns", request)

    async def list_runs(
        self: RunHost, labels: Mapping[str, str] | None = None, states: Iterable[int] = ()
    ) -> list[run_pb2.Run]:
        """Every matching run, in creation order (walks all pages)."""
        request = pb.ListRunsRequest(label_selector=dict(labels or {}), states=list(states), page_size=1000)
        return await self._every_page("ListRuns", request, "runs")

    async def list_run_steps(
        self: RunHost, run_id: str, after_step: int = 0, metric_names: Iterable[str] = ()
    ) -> list[run_pb2.RunStep]:
        """Every step of the run in step order (walks all pages); only the named metrics when given."""
        request = pb.ListRunStepsRequest(
            run_id=run_id, after_step=after_step, metric_names=list(metric_names), page_size=10000
        )
        return await self._every_page("ListRunSteps", request, "steps")

    def watch_runs(
        self: RunHost,
        run_id: str = "",
        labels: Mapping[str, str] | None = None,
        include_steps: bool = False,
        after_revision: int = 0,
    ) -> AsyncIterator[pb.WatchRunsResponse]:
        """Snapshot then changes; reconnects and resumes after the last revision it delivered."""
        selector = dict(labels or {})

        def open_after(revision: int) -> Any:
            request = pb.WatchRunsRequest(
                run_id=run_id, label_selector=selector, include_steps=include_steps, after_revision=revision
            )
            return self.stub.WatchRuns(request, metadata=self._metadata)

        return revision_watch("run watch", open_after, after_revision, pb.RUN_CHANGE_TYPE_SNAPSHOT, self._retry)
