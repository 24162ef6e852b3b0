"""Training progress: runs and their per-step metrics, kept by the ledger so they outlive deleted rollouts.

Like the rest of the core, every change happens in one synchronous step on the event loop's thread (validate,
change memory, hand the operations to the store, publish to watchers) and is acknowledged only once durable.
Runs have their own revision counter and change ring, so a WatchRuns client resumes from its last revision
without loss or duplicates exactly as a WatchRollouts client does.

Guarantee: that resume point outlives a restart. Every stored run and step keeps the revision of its last change,
and the ring starts from them on load, so a watcher resuming after a kill -9 is given what changed after its
revision (in its present state), once. Only a resume from before the last deletion must start over (OUT_OF_RANGE):
a deleted run leaves nothing in the store to replay. A report that changes nothing (one sent again because its
answer was lost to a restart) is no change: it gets no revision and streams nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from services._gen.agl.v1 import ledger_service_pb2, run_pb2

from .errors import InvalidArgument, NotFound
from .hub import RolloutHub
from .paging import page_size, parse_token
from .store import DELETE_RUN, PUT_META, PUT_RUN, PUT_RUN_STEP, Loaded, Op
from .validation import check_json, check_safe_id

log = logging.getLogger(__name__)

RUNNING = run_pb2.RUN_STATE_RUNNING
SUCCEEDED = run_pb2.RUN_STATE_SUCCEEDED
FAILED = run_pb2.RUN_STATE_FAILED
SNAPSHOT = ledger_service_pb2.RUN_CHANGE_TYPE_SNAPSHOT
SYNCED = ledger_service_pb2.RUN_CHANGE_TYPE_SYNCED
RUN = ledger_service_pb2.RUN_CHANGE_TYPE_RUN
STEP = ledger_service_pb2.RUN_CHANGE_TYPE_STEP
DELETE = ledger_service_pb2.RUN_CHANGE_TYPE_DELETE

META_RUNS_REVISION = "runs_revision"
META_RUNS_DELETED_REVISION = "runs_deleted_revision"  # the revision of the last deletion: no resume from before it
MAX_METRIC_NAME = 256
MAX_METRICS_PER_STEP = 10_000
MAX_STEPS_PER_REPORT = 10_000

RunItem = tuple[int, int, run_pb2.Run | None, run_pb2.RunStep | None]  # change type, revision, run, step


@dataclass(frozen=True, slots=True)
class RunChange:
    """One change of the runs feed; `revision`/`concerns` make it fit the rollout hub's ring and subscribers."""

    revision: int
    kind: int
    run_id: str
    run: run_pb2.Run  # the run after the change (for DELETE: as it was)
    step: run_pb2.RunStep | None
    lsn: int


class RunFilter:
    __slots__ = ("include_steps", "labels", "run_id")

    def __init__(self, run_id: str, labels: Mapping[str, str], include_steps: bool) -> None:
        self.run_id = run_id
        self.labels = dict(labels)
        self.include_steps = include_steps

    def matches(self, run: run_pb2.Run) -> bool:
        if self.run_id and run.run_id != self.run_id:
            return False
        return all(run.labels.get(k) == v for k, v in self.labels.items())

    def concerns(self, change: RunChange) -> bool:
        if change.kind == STEP and not self.include_steps:
            return False
        return self.matches(change.run)


class RunEntry:
    __slots__ = ("lsn", "ordinal", "run", "steps")

    def __init__(self, run: run_pb2.Run, ordinal: int) -> None:
        self.run = run  # replaced, never mutated, when it changes
        self.ordinal = ordinal
        self.steps: dict[int, run_pb2.RunStep] = {}  # step -> stored step (replaced on change)
        self.lsn = 0


def check_run_id(run_id: str, where: str = "request") -> None:
    if not run_id:
        raise InvalidArgument(f"{where}: run_id is required")
    check_safe_id(run_id, "run_id", where)


def check_metrics(metrics: Mapping[str, float], where: str) -> None:
    if len(metrics) > MAX_METRICS_PER_STEP:
        raise InvalidArgument(f"{where}: {len(metrics)} metrics; at most {MAX_METRICS_PER_STEP} per step")
    for name, value in metrics.items():
        if not name or len(name) > MAX_METRIC_NAME:
            raise InvalidArgument(f"{where}: metric names must be 1-{MAX_METRIC_NAME} characters ({name[:40]!r})")
        if not math.isfinite(value):
            raise InvalidArgument(f"{where}: metric {name!r} is {value}; values must be finite numbers")


class RunBook:
    """Runs, their steps and the runs feed. `write` hands operations to the store and returns the LSN;
    `durable` waits for an LSN."""

    def __init__(
        self,
        write: Callable[[list[Op]], int],
        durable: Callable[[int], Awaitable[None]],
        *,
        ring_size: int = 50_000,
        watch_buffer: int = 8192,
    ) -> None:
        self._write = write
        self._durable = durable
        self._ring_size = ring_size
        self._watch_buffer = watch_buffer
        self.runs: dict[str, RunEntry] = {}
        self.revision = 0
        self.last_lsn = 0
        self.hub = RolloutHub(0, ring_size, watch_buffer)
        self.watchers = 0

    def load(self, loaded: Loaded) -> None:
        revision = int(loaded.meta.get(META_RUNS_REVISION, 0))
        for ordinal, data in loaded.runs:
            run = run_pb2.Run.FromString(data)
            self.runs[run.run_id] = RunEntry(run, ordinal)
            revision = max(revision, run.revision, ordinal)
        for data in loaded.run_steps:
            step = run_pb2.RunStep.FromString(data)
            entry = self.runs.get(step.run_id)
            if entry is not None:
                entry.steps[step.step] = step
                revision = max(revision, step.revision)
        kept: list[RunChange] = []
        for entry in self.runs.values():
            entry.steps = dict(sorted(entry.steps.items()))
            run = entry.run
            kept.append(RunChange(run.revision, RUN, run.run_id, run, None, 0))
            kept.extend(RunChange(s.revision, STEP, run.run_id, run, s, 0) for s in entry.steps.values())
        kept.sort(key=lambda change: change.revision)
        self.revision = revision
        self.hub = RolloutHub(revision, self._ring_size, self._watch_buffer)
        self.hub.restore(int(loaded.meta.get(META_RUNS_DELETED_REVISION, 0)), kept)  # type: ignore[arg-type]
        if self.runs:
            steps = sum(len(e.steps) for e in self.runs.values())
            log.info("runs loaded: %d runs, %d steps, run revision %d", len(self.runs), steps, revision)

    def _commit(self, ops: list[Op]) -> int:
        ops.append((PUT_META, META_RUNS_REVISION, self.revision))
        self.last_lsn = self._write(ops)
        return self.last_lsn

    def entry(self, run_id: str) -> RunEntry:
        entry = self.runs.get(run_id)
        if entry is None:
            raise NotFound(f"run {run_id} not found")
        return entry

    # -- changes ---------------------------------------------------------------------------------------------------

    async def create(self, run_id: str, labels: Mapping[str, str], config_json: str) -> tuple[run_pb2.Run, bool]:
        check_run_id(run_id)
        check_json(config_json, "config_json", f"run {run_id}")
        existing = self.runs.get(run_id)
        if existing is not None:
            await self._durable(existing.lsn)
            return existing.run, False
        self.revision += 1
        run = run_pb2.Run(run_id=run_id, labels=dict(labels), config_json=config_json, state=RUNNING)
        now = time.time_ns()
        run.create_time.FromNanoseconds(now)
        run.update_time.FromNanoseconds(now)
        run.revision = self.revision
        entry = RunEntry(run, self.revision)
        self.runs[run_id] = entry
        lsn = self._commit([(PUT_RUN, run_id, entry.ordinal, run.SerializeToString())])
        entry.lsn = lsn
        self.hub.publish(RunChange(self.revision, RUN, run_id, run, None, lsn))
        log.info("run %s created", run_id)
        await self._durable(lsn)
        return run, True

    async def update_state(self, run_id: str, state: int, error_message: str) -> run_pb2.Run:
        if state not in (RUNNING, SUCCEEDED, FAILED):
            raise InvalidArgument(f"run {run_id}: state must be RUNNING, SUCCEEDED or FAILED, not {state}")
        entry = self.entry(run_id)
        run = run_pb2.Run()
        run.CopyFrom(entry.run)
        run.state = state
        run.error_message = error_message if state == FAILED else ""
        now = time.time_ns()
        run.update_time.FromNanoseconds(now)
        if state == RUNNING:
            run.ClearField("end_time")
        else:
            run.end_time.FromNanoseconds(now)
        self.revision += 1
        run.revision = self.revision
        lsn = self._commit([(PUT_RUN, run_id, entry.ordinal, run.SerializeToString())])
        entry.run, entry.lsn = run, lsn
        self.hub.publish(RunChange(self.revision, RUN, run_id, run, None, lsn))
        log.info("run %s is %s", run_id, run_pb2.RunState.Name(state))
        await self._durable(lsn)
        return run

    async def delete(self, run_ids: Iterable[str]) -> int:
        ops: list[Op] = []
        changes: list[tuple[int, RunEntry]] = []
        for run_id in dict.fromkeys(run_ids):
            entry = self.runs.pop(run_id, None)
            if entry is None:
                continue
            self.revision += 1
            ops.append((DELETE_RUN, run_id))
            changes.append((self.revision, entry))
        if not ops:
            await self._durable(self.last_lsn)
            return 0
        ops.append((PUT_META, META_RUNS_DELETED_REVISION, self.revision))
        lsn = self._commit(ops)
        for revision, entry in changes:
            self.hub.publish(RunChange(revision, DELETE, entry.run.run_id, entry.run, None, lsn))
        log.info("runs deleted: %s", ", ".join(e.run.run_id for _, e in changes))
        await self._durable(lsn)
        return len(changes)

    async def report_steps(
        self, run_id: str, steps: list[run_pb2.RunStep]
    ) -> tuple[list[run_pb2.RunStep], run_pb2.Run]:
        check_run_id(run_id)
        if len(steps) > MAX_STEPS_PER_REPORT:
            raise InvalidArgument(f"run {run_id}: {len(steps)} steps in one report; at most {MAX_STEPS_PER_REPORT}")
        for i, step in enumerate(steps):
            where = f"steps[{i}] (run {run_id}, step {step.step})"
            if step.run_id and step.run_id != run_id:
                raise InvalidArgument(f"steps[{i}]: run_id {step.run_id!r} differs from the request's {run_id!r}")
            if step.step < 0:
                raise InvalidArgument(f"{where}: step must not be negative")
            check_metrics(step.metrics, where)
        entry = self.entry(run_id)
        now = time.time_ns()
        stored: list[run_pb2.RunStep] = []
        ops: list[Op] = []
        changed: list[run_pb2.RunStep] = []
        for step in steps:
            previous = entry.steps.get(step.step)
            if previous is not None and all(previous.metrics.get(k) == v for k, v in step.metrics.items()):
                stored.append(previous)  # a report sent again (its answer lost to a restart): not a change
                continue
            merged = run_pb2.RunStep()
            if previous is not None:
                merged.CopyFrom(previous)
            else:
                merged.run_id = run_id
                merged.step = step.step
                merged.create_time.FromNanoseconds(now)
            merged.metrics.update(step.metrics)
            merged.update_time.FromNanoseconds(now)
            self.revision += 1
            merged.revision = self.revision
            if previous is None and entry.steps and step.step < next(reversed(entry.steps)):
                entry.steps[step.step] = merged
                entry.steps = dict(sorted(entry.steps.items()))
            else:
                entry.steps[step.step] = merged
            stored.append(merged)
            changed.append(merged)
            ops.append((PUT_RUN_STEP, run_id, step.step, merged.SerializeToString()))
        if not changed:
            await self._durable(entry.lsn)
            return stored, entry.run
        run = run_pb2.Run()
        run.CopyFrom(entry.run)
        run.last_step = max(entry.steps) if entry.steps else 0
        run.step_count = len(entry.steps)
        run.update_time.FromNanoseconds(now)
        self.revision += 1
        run.revision = self.revision
        ops.append((PUT_RUN, run_id, entry.ordinal, run.SerializeToString()))
        lsn = self._commit(ops)
        entry.run, entry.lsn = run, lsn
        first = self.revision - len(changed)
        for i, merged in enumerate(changed):
            self.hub.publish(RunChange(first + i, STEP, run_id, run, merged, lsn))
        self.hub.publish(RunChange(self.revision, RUN, run_id, run, None, lsn))
        log.debug(
            "run %s: %d steps reported, %d changed (last step %d)", run_id, len(stored), len(changed), run.last_step
        )
        await self._durable(lsn)
        return stored, run

    # -- reads -----------------------------------------------------------------------------------------------------

    async def get(self, run_id: str) -> run_pb2.Run:
        check_run_id(run_id)
        entry = self.entry(run_id)
        await self._durable(entry.lsn)
        return entry.run

    async def list(
        self, labels: Mapping[str, str], state_filter: Iterable[int], size: int, token: str
    ) -> tuple[list[run_pb2.Run], str]:
        size = page_size(size, 100, 1000)
        after = parse_token(token)
        wanted = frozenset(state_filter)
        run_filter = RunFilter("", labels, False)
        out: list[run_pb2.Run] = []
        lsn = 0
        for entry in self.runs.values():
            if entry.ordinal <= after or (wanted and entry.run.state not in wanted):
                continue
            if not run_filter.matches(entry.run):
                continue
            if len(out) == size:
                await self._durable(lsn)
                return out, str(self.runs[out[-1].run_id].ordinal)
            out.append(entry.run)
            lsn = max(lsn, entry.lsn)
        await self._durable(lsn)
        return out, ""

    async def list_steps(
        self, run_id: str, after_step: int, names: Iterable[str], size: int, token: str
    ) -> tuple[list[run_pb2.RunStep], str]:
        check_run_id(run_id)
        entry = self.entry(run_id)
        size = page_size(size, 1000, 10000)
        if after_step < 0:
            raise InvalidArgument("after_step must not be negative")
        # The token is the first step of the next page.
        lowest = max(after_step + 1 if after_step else 0, parse_token(token))
        keep = list(names)
        out: list[run_pb2.RunStep] = []
        for number, step in entry.steps.items():
            if number < lowest:
                continue
            if len(out) == size:
                await self._durable(entry.lsn)
                return out, str(out[-1].step + 1)
            if keep:
                trimmed = run_pb2.RunStep()
                trimmed.CopyFrom(step)
                trimmed.ClearField("metrics")
                trimmed.metrics.update({k: step.metrics[k] for k in keep if k in step.metrics})
                step = trimmed
            out.append(step)
        await self._durable(entry.lsn)
        return out, ""

    async def watch(
        self, run_id: str, labels: Mapping[str, str], include_steps: bool, after_revision: int
    ) -> AsyncIterator[RunItem]:
        """Snapshot (or replay after `after_revision`), SYNCED, then live changes; each with its run revision."""
        if after_revision < 0:
            raise InvalidArgument("after_revision must not be negative")
        if run_id:
            check_run_id(run_id)
        run_filter = RunFilter(run_id, labels, include_steps)
        sub = self.hub.subscribe(run_filter)  # type: ignore[arg-type]
        self.watchers += 1
        try:
            synced = self.revision
            if after_revision == 0:
                snapshot = [e for e in self.runs.values() if run_filter.matches(e.run)]
                items: list[RunItem] = []
                for entry in snapshot:
                    items.append((SNAPSHOT, synced, entry.run, None))
                    if include_steps:
                        items.extend((SNAPSHOT, synced, None, step) for step in entry.steps.values())
                await self._durable(self.last_lsn)
                for item in items:
                    yield item
            else:
                replay = [c for c in self.hub.changes_after(after_revision, synced) if run_filter.concerns(c)]
                sub.last_revision = after_revision
                for change in replay:
                    await self._durable(change.lsn)
                    sub.last_revision = change.revision
                    yield _item(change)
            sub.last_revision = synced
            yield SYNCED, synced, None, None
            while True:
                change = await sub.next()
                await self._durable(change.lsn)
                sub.last_revision = change.revision
                yield _item(change)
        finally:
            self.watchers -= 1
            self.hub.unsubscribe(sub)


def _item(change: RunChange) -> RunItem:
    if change.kind == DELETE:
        return DELETE, change.revision, run_pb2.Run(run_id=change.run_id), None
    if change.kind == STEP:
        return STEP, change.revision, None, change.step
    return change.kind, change.revision, change.run, None
