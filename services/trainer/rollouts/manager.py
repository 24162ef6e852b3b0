"""The rollout manager: the trainer's rollout phase, driven through the ledger.

Per step it creates `n` rollouts per sample (deterministic ids, one group per sample, run/step labels),
then waits on the run's terminal feed. Sync mode returns when every group of the step is complete; async
mode keeps `async_train_batch_size` groups in flight and returns as soon as `train_batch_size` groups are
complete (all `n` siblings terminal), oldest first, carrying the rest over. Consumed rollouts go through
the hooks and become RolloutTraces; those of the run's last `keep_steps` steps stay in the ledger for
inspection, older ones are deleted (services/trainer/rollouts/retention.py). All ledger traffic goes through
services.client.LedgerClient. A resumed trainer's manager first goes back to the state saved with its checkpoint
(services/trainer/rollouts/rewind.py).

The group bookkeeping, the enqueue, the wait and the consume share one state and its write-ahead order, so
they live together; the pure parts (specs, state file, feed, retention, triplets, rewind) are modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import RETRY_LATER, LedgerClient, LedgerError
from services.trainer.data.triplets import CallText, RolloutTrace, call_text, trace_from_events
from services.trainer.judge.group_judge import GroupJudge, JudgeFailure, Member, judge_groups
from services.trainer.rollouts import hooks as user_hooks
from services.trainer.rollouts.feed import TerminalFeed
from services.trainer.rollouts.retention import KEEP_ALL, TERMINAL_STATES, check_keep_steps, expired
from services.trainer.rollouts.rewind import rewind
from services.trainer.rollouts.specs import (
    LABEL_DATA_ID,
    LABEL_RUN,
    LABEL_STEP,
    LaunchSettings,
    Sample,
    build_specs,
    check_run_id,
    group_id,
)
from services.trainer.rollouts.state import GroupRecord, ManagerState, load_state, save_state

log = logging.getLogger(__name__)

_SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED


@dataclass(frozen=True)
class ManagerSettings:
    run_id: str
    n: int = 1
    train_batch_size: int = 1
    # "sync" or "async".
    mode: str = "sync"
    # Groups kept in flight in async mode (at least train_batch_size).
    async_train_batch_size: int = 0
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    reward_fillna_value: float = 0.0
    # Consumed rollouts of the run's last keep_steps steps stay in the ledger; 0: deleted after their step,
    # -1: all kept. The trainer's config defaults to 2 (agl.retention.keep_steps).
    keep_steps: int = 0
    state_path: Path | None = None
    create_attempts: int = 8
    progress: bool = True
    # Seconds between state flushes while waiting.
    flush_interval_s: float = 0.5
    # Validation calls carry no token ids: read each validation rollout's full model calls for their text
    # (the trajectory log's "calls"); one ListEvents per validation rollout, so only when someone reads it.
    validation_call_texts: bool = False


@dataclass
class StepResult:
    # Every consumed rollout, failed ones included, in consumption order (the caller decides what trains:
    # services/trainer/data/infra_policy.py).
    traces: list[RolloutTrace]
    group_ids: list[str]
    metrics: dict[str, float]
    counts: Counter[str]
    # Groups the judge could not score: left out of `traces` (services/trainer/judge/group_judge.py).
    judge_failures: list[JudgeFailure] = field(default_factory=list)


def failure_reason_name(reason: int) -> str:
    """ "KILLED" for FAILURE_REASON_KILLED; "" for none."""
    if not reason:
        return ""
    try:
        return rollout_pb2.FailureReason.Name(reason).removeprefix("FAILURE_REASON_")
    except ValueError:
        return str(reason)


def _seconds(ts: Any) -> float:
    return ts.seconds + ts.nanos / 1e9


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{prefix}/mean": sum(values) / len(values), f"{prefix}/max": max(values)}


class RolloutManager:
    def __init__(
        self,
        client: LedgerClient,
        settings: ManagerSettings,
        hooks: Any = None,
        *,
        judge: GroupJudge | None = None,
        resume_from: Path | None = None,
        samples: Mapping[str, Sample] | None = None,
    ) -> None:
        """resume_from: the state saved with the checkpoint a resumed trainer loads (trainer/rollouts/rewind.py);
        samples: the run's tasks by data id, to create again what the rewind needs."""
        if settings.mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, not {settings.mode!r}")
        self.client = client
        self.settings = settings
        self.run_id = check_run_id(settings.run_id)
        check_keep_steps(settings.keep_steps)
        self.hooks = hooks
        # Rewards from a judge model for the groups' rollouts (services/trainer/judge/); None: the agents' own.
        self.judge = judge
        self.state: ManagerState = load_state(settings.state_path)
        self._group_of: dict[str, str] = {}
        self._remaining: dict[str, int] = {}
        self._complete: dict[str, None] = {}
        self.feed = TerminalFeed(client, self.run_id, self.state, on_entry=self._arrived)
        self._last_flush = 0.0
        self._resume_from = resume_from
        self._samples = samples or {}

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._resume_from is not None and self._resume_from.exists():
            snapshot = load_state(self._resume_from)
            await rewind(
                self.client, self.run_id, snapshot, samples=self._samples, n=self.settings.n,
                launch=self.settings.launch, create=self._create,
            )  # fmt: skip
            self.state = snapshot
            self.feed = TerminalFeed(self.client, self.run_id, self.state, on_entry=self._arrived)
            self._flush(force=True)
        for record in self.state.groups.values():
            self._track(record)
        self.feed.start()
        await self._delete_pending()

    def sample_of(self, data_id: str) -> Sample:
        """The run's task with this data id (what a step lost to the infrastructure runs again)."""
        try:
            return self._samples[data_id]
        except KeyError:
            raise KeyError(f"task {data_id!r} is not among the run's training tasks") from None

    def snapshot(self, path: Path, step: int) -> None:
        """Saves the state as of the checkpoint of `step` (written before the checkpoint is declared whole)."""
        save_state(path, replace(self.state, checkpoint_step=step))

    async def close(self) -> None:
        await self.feed.stop()
        if self.judge is not None:
            await self.judge.close()
        self._flush(force=True)

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or (self.feed.dirty and now - self._last_flush >= self.settings.flush_interval_s):
            save_state(self.settings.state_path, self.state)
            self.feed.dirty = False
            self._last_flush = now

    # -- group bookkeeping ----------------------------------------------------------------------------------

    def _track(self, record: GroupRecord) -> None:
        missing = 0
        for rollout_id in record.rollout_ids:
            self._group_of[rollout_id] = record.group_id
            if rollout_id not in self.feed.entries:
                missing += 1
        self._remaining[record.group_id] = missing
        if missing == 0:
            self._complete[record.group_id] = None

    def _untrack(self, record: GroupRecord) -> None:
        for rollout_id in record.rollout_ids:
            self._group_of.pop(rollout_id, None)
        self._remaining.pop(record.group_id, None)
        self._complete.pop(record.group_id, None)

    def _arrived(self, rollout_id: str) -> None:
        group = self._group_of.get(rollout_id)
        if group is None:
            return
        self._remaining[group] -= 1
        if self._remaining[group] == 0:
            self._complete[group] = None

    # -- ledger calls ---------------------------------------------------------------------------------------

    async def register_endpoints(self, model_name: str, endpoints: Sequence[str], version: int) -> None:
        """Registers the engines serving the current weights; model version = global step."""
        await self.client.register_models(
            [model_pb2.ModelEndpoint(model_name=model_name, endpoint=e, version=version) for e in endpoints]
        )
        log.info("registered %d endpoints of %s at version %d", len(endpoints), model_name, version)

    async def replace_endpoints(self, model_name: str, endpoints: Sequence[str], version: int) -> int:
        """Makes `endpoints` the model's whole endpoint set: upserts them, then deletes every other endpoint
        registered under `model_name` (an earlier launch's engines, whose ports are gone). Returns how many
        were deleted. Upsert first, so the proxies never see the model without an endpoint. Only for a model
        name this trainer alone serves (verl's own replicas); engines registered by others would go too."""
        await self.register_endpoints(model_name, endpoints, version)
        keep = set(endpoints)
        stale = [e.endpoint for e in await self.client.list_models(model_name) if e.endpoint not in keep]
        if not stale:
            return 0
        deleted = await self.client.delete_models(
            [model_pb2.ModelEndpointKey(model_name=model_name, endpoint=e) for e in stale]
        )
        log.info("removed %d endpoints of %s left by an earlier launch: %s", deleted, model_name, ", ".join(stale))
        return deleted

    async def _create(self, specs: list[rollout_pb2.RolloutSpec]) -> list[rollout_pb2.Rollout]:
        """Creates with retries; ids are pre-assigned, so a retry after a lost answer creates nothing twice."""
        specs = [await user_hooks.on_enqueue(self.hooks, spec) for spec in specs]
        delay = 0.1
        cleared = False
        for attempt in range(1, self.settings.create_attempts + 1):
            try:
                if not cleared:  # only before the first create is sent: later, a finished id may be this pass's
                    await self._clear_kept(specs)
                    cleared = True
                return await self.client.create_rollouts(specs)
            except LedgerError as err:
                if not isinstance(err, RETRY_LATER) or attempt == self.settings.create_attempts:
                    raise
                log.warning("creating %d rollouts failed (%s); retry %d", len(specs), err.code().name, attempt)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    async def _clear_kept(self, specs: Sequence[rollout_pb2.RolloutSpec]) -> None:
        """Deletes finished rollouts that have the ids about to be created: kept (retention) from an earlier pass
        over the same step, as when the trainer resumes from a checkpoint older than its last step. Creating
        an existing id is a no-op, so without this the step would wait for a terminal entry received long ago."""
        ids = {spec.rollout_id for spec in specs}
        steps = sorted({spec.metadata.labels.get(LABEL_STEP, "") for spec in specs})
        stale: list[str] = []
        for step in steps:
            labels = {LABEL_RUN: self.run_id, **({LABEL_STEP: step} if step else {})}
            listed = await self.client.list_rollouts(states=TERMINAL_STATES, labels=labels)
            stale.extend(r.rollout_id for r in listed if r.rollout_id in ids)
        if not stale:
            return
        await self.client.delete_rollouts(stale)
        for rollout_id in stale:
            log.info("deleted kept rollout %s of an earlier pass over its step; it runs again", rollout_id)
            self._forget(rollout_id)

    def _forget(self, rollout_id: str) -> None:
        """Drops a received entry whose rollout was deleted; its group, if tracked, waits for it again."""
        if self.feed.entries.pop(rollout_id, None) is not None:
            group = self._group_of.get(rollout_id)
            if group is not None:
                self._remaining[group] += 1
                self._complete.pop(group, None)
        self.state.pending.pop(rollout_id, None)

    async def _retire(self, step: int, records: Sequence[GroupRecord]) -> None:
        """After consuming at `step`: deletes the run's consumed rollouts that fell out of the retention window.

        The ones just consumed and already out of it are queued for deletion in the state file with the groups'
        removal; older steps' are found by listing the run's finished rollouts in the ledger, so a restarted
        trainer (or one whose window shrank) deletes what an earlier process kept. A failed listing is retried
        at the next step."""
        keep = self.settings.keep_steps
        queued = set(self.state.to_delete)
        if keep != KEEP_ALL:
            for record in records:
                if record.step <= step - keep:
                    self.state.to_delete.extend(i for i in record.rollout_ids if i not in queued)
                    queued.update(record.rollout_ids)
        self._flush(force=True)
        if keep == KEEP_ALL:
            return
        try:
            listed = await self.client.list_rollouts(states=TERMINAL_STATES, labels={LABEL_RUN: self.run_id})
        except LedgerError as err:
            log.warning("listing run %s for retention failed (%s); retried next step", self.run_id, err.code().name)
        else:
            old = expired(listed, latest_step=step, keep_steps=keep, in_flight=self._group_of)
            for rollout_id in old:
                self._forget(rollout_id)
            self.state.to_delete.extend(i for i in old if i not in queued)
            self._flush(force=True)
        await self._delete_pending()

    async def _delete_pending(self) -> None:
        if not self.state.to_delete:
            return
        ids = list(self.state.to_delete)
        try:
            await self.client.delete_rollouts(ids)
        except LedgerError as err:
            log.warning("deleting %d consumed rollouts failed (%s); will retry", len(ids), err.code().name)
            return
        self.state.to_delete = [i for i in self.state.to_delete if i not in set(ids)]
        self._flush(force=True)

    # -- enqueue --------------------------------------------------------------------------------------------

    def _new_group(
        self, step: int, slot: int, sample: Sample, is_train: bool, kind: str
    ) -> list[rollout_pb2.RolloutSpec]:
        specs = build_specs(
            run_id=self.run_id,
            step=step,
            slot=slot,
            sample=sample,
            n=self.settings.n if is_train else 1,
            launch=self.settings.launch,
            is_train=is_train,
            kind=kind,
        )
        record = GroupRecord(
            group_id(self.run_id, step, slot, kind), sample.data_id, step, [s.rollout_id for s in specs], kind
        )
        self.state.groups[record.group_id] = record
        self._track(record)
        return specs

    async def _enqueue(self, step: int, samples: Iterator[Sample], redo: int = 0) -> tuple[list[str] | None, int]:
        """Creates this step's groups; returns the groups to wait for (None: async) and the rollouts created.

        redo: how many times the step's rollouts were all lost and are run again; in sync mode each try takes slots
        of its own (the earlier try's rollouts may still be kept in the ledger under theirs)."""
        specs: list[rollout_pb2.RolloutSpec] = []
        wanted: list[str] | None = None
        if self.settings.mode == "sync":
            wanted = []
            first = redo * self.settings.train_batch_size
            for slot in range(first, first + self.settings.train_batch_size):
                sample = next(samples, None)
                if sample is None:
                    break
                gid = group_id(self.run_id, step, slot)
                wanted.append(gid)
                if gid not in self.state.groups:
                    specs.extend(self._new_group(step, slot, sample, True, "s"))
        else:
            target = max(self.settings.async_train_batch_size, self.settings.train_batch_size)
            key = str(step)
            while len(self._train_groups()) < target:
                sample = next(samples, None)
                if sample is None:
                    break
                slot = self.state.slots.get(key, 0)
                self.state.slots[key] = slot + 1
                specs.extend(self._new_group(step, slot, sample, True, "s"))
        # Write ahead: a manager restarted after the create knows these groups.
        self._flush(force=True)
        if specs:
            await self._create(specs)
        return wanted, len(specs)

    # -- the step -------------------------------------------------------------------------------------------

    def _train_groups(self) -> list[GroupRecord]:
        return [r for r in self.state.groups.values() if r.kind == "s"]

    def _ready(self, wanted: list[str] | None) -> list[str] | None:
        """The groups to consume now, or None to keep waiting. wanted=None: async selection."""
        if wanted is not None:
            if len(self._complete) < len(wanted):  # cheap rejection while rollouts stream in
                return None
            return wanted if all(g in self._complete for g in wanted) else None
        need = min(self.settings.train_batch_size, len(self._train_groups()))
        complete = [g for g in self._complete if self.state.groups[g].kind == "s"]
        if len(complete) < need or need == 0:
            return None
        # Oldest groups first; within a step, in creation order (dict order of state.groups).
        position = {g: i for i, g in enumerate(self.state.groups)}
        complete.sort(key=lambda g: (self.state.groups[g].step, position[g]))
        return complete[:need]

    async def _wait(self, wanted: list[str] | None, desc: str) -> list[str]:
        batch = min(self.settings.train_batch_size, len(self._train_groups()))
        total_groups = len(wanted) if wanted is not None else batch
        bar = tqdm(
            total=total_groups,
            desc=desc,
            unit="group",
            delay=2.0,
            disable=not self.settings.progress,
            leave=False,
        )
        try:
            while True:
                self.feed.check()
                chosen = self._ready(wanted)
                if not bar.disable:
                    pool = wanted if wanted is not None else self._complete
                    bar.n = min(sum(1 for g in pool if g in self._complete), total_groups)
                    bar.set_postfix(rollouts_done=self.feed.received, refresh=False)
                    bar.refresh()
                if chosen is not None:
                    return chosen
                self._flush()
                self.feed.changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.feed.changed.wait(), timeout=self.settings.flush_interval_s)
        finally:
            bar.close()

    async def collect(self, step: int, samples: Iterator[Sample], redo: int = 0) -> StepResult:
        """Runs the rollout phase of one training step (redo: see _enqueue)."""
        started = time.monotonic()
        await self._delete_pending()
        wanted, created = await self._enqueue(step, samples, redo)
        chosen = await self._wait(wanted, f"step {step} rollouts")
        waited = time.monotonic() - started
        result = await self._consume(step, chosen)
        if self.settings.mode == "sync":
            await self._abandon(step)
        result.metrics.update(
            {
                "agl/step/created_rollouts": float(created),
                "agl/step/wait_s": waited,
                "agl/feed/duplicates_skipped": float(self.feed.duplicates_skipped),
            }
        )
        carried = self._train_groups()
        result.metrics["agl/async/carried_groups"] = float(len(carried))
        carried_complete = sum(1 for r in carried if r.group_id in self._complete)
        result.metrics["agl/async/carried_complete_groups"] = float(carried_complete)
        result.metrics.update(_stats("agl/async/carried_age", [float(step - r.step) for r in carried]))
        return result

    async def evaluate(self, step: int, samples: Sequence[Sample]) -> StepResult:
        """One rollout per sample (is_train false), waited for completely; for validation metrics."""
        specs: list[rollout_pb2.RolloutSpec] = []
        wanted: list[str] = []
        for slot, sample in enumerate(samples):
            gid = group_id(self.run_id, step, slot, "v")
            wanted.append(gid)
            if gid not in self.state.groups:
                specs.extend(self._new_group(step, slot, sample, False, "v"))
        self._flush(force=True)
        if specs:
            await self._create(specs)
        chosen = await self._wait(wanted, f"step {step} validation")
        return await self._consume(step, chosen)

    async def _call_texts(self, rollout_id: str) -> list[CallText]:
        try:
            events = await self.client.list_events(rollout_id, event_type="model_request")
        except LedgerError as err:
            log.warning("rollout %s: reading its calls for the trajectory log failed (%s)", rollout_id, err.code().name)
            return []
        return [call_text(e.model_request) for e in events if e.HasField("model_request")]

    async def _abandon(self, step: int) -> None:
        """Sync mode: groups left from another step or an interrupted validation are dropped and deleted."""
        stale = [r for r in self.state.groups.values() if r.step != step or r.kind != "s"]
        for record in stale:
            log.warning("dropping group %s left over from step %d", record.group_id, record.step)
            self._untrack(record)
            del self.state.groups[record.group_id]
            for rollout_id in record.rollout_ids:
                self.feed.entries.pop(rollout_id, None)
                self.state.pending.pop(rollout_id, None)
            self.state.to_delete.extend(record.rollout_ids)
        if stale:
            self._flush(force=True)
            await self._delete_pending()

    async def _consume(self, step: int, chosen: list[str]) -> StepResult:
        records = [self.state.groups[g] for g in chosen]
        counts: Counter[str] = Counter()
        traces: list[RolloutTrace] = []
        queue_wait: list[float] = []
        run_time: list[float] = []
        ages: list[float] = []
        succeeded = failed = 0
        appended: list[event_pb2.Event] = []
        hook_events = 0
        judge_failures: list[JudgeFailure] = []
        members: dict[str, list[tuple[Any, bool, list[event_pb2.Event]]]] = {}
        for record in records:
            ages.append(float(step - record.step))
            group = members[record.group_id] = []
            for entry in self.feed.take(record.rollout_ids):
                rollout = entry.rollout
                ok = rollout.status.state == _SUCCEEDED
                succeeded += ok
                failed += not ok
                status = rollout.status
                if status.HasField("start_time") and status.start_time.seconds:
                    queue_wait.append(_seconds(status.start_time) - _seconds(status.create_time))
                    if status.HasField("end_time"):
                        run_time.append(_seconds(status.end_time) - _seconds(status.start_time))
                extra = await user_hooks.on_finished(self.hooks, rollout, entry.events, ok)
                known = {e.event_id for e in entry.events if e.event_id}
                extra = [e for e in extra if e.event_id not in known]
                appended.extend(extra)
                hook_events += len(extra)
                group.append((entry, ok, extra))
        if self.judge is not None:  # the judge's rewards join the hooks' events; a group it could not score is left out
            groups = {g: [Member(e.rollout, [*e.events, *x], ok) for e, ok, x in m] for g, m in members.items()}
            judged, judge_failures = await judge_groups(self.judge, groups)
            for entry, _, extra in (member for group in members.values() for member in group):
                extra.extend(judged.get(entry.rollout.rollout_id, []))
                appended.extend(judged.get(entry.rollout.rollout_id, []))
        left_out = {failure.group_id for failure in judge_failures}
        for record in records:
            if record.group_id in left_out:
                continue
            for entry, ok, extra in members[record.group_id]:
                rollout, status = entry.rollout, entry.rollout.status
                trace = trace_from_events(
                    rollout.rollout_id,
                    record.group_id,
                    rollout.metadata.labels.get(LABEL_DATA_ID, record.data_id),
                    [*entry.events, *extra],
                    reward_fillna_value=self.settings.reward_fillna_value,
                    counts=counts,
                    succeeded=ok,
                    failure_reason="" if ok else failure_reason_name(status.failure_reason),
                    error_message="" if ok else status.error_message,
                    attempts=max(len(status.attempts), 1),
                    attempt_id=status.attempt_id or (status.attempts[-1].attempt_id if status.attempts else ""),
                )
                if record.kind == "v" and self.settings.validation_call_texts:
                    trace.call_texts = await self._call_texts(rollout.rollout_id)
                traces.append(trace)
        if appended:  # the hooks' events belong to rollouts that have ended: the ledger takes them only when told so
            await self.client.append_events(appended, allow_terminal=True)
        consumed = [rid for record in records for rid in record.rollout_ids]
        for record in records:
            self._untrack(record)
            del self.state.groups[record.group_id]
        await self._retire(step, records)
        for rid in consumed:
            log.debug("consumed rollout %s at step %d", rid, step)
        metrics: dict[str, float] = {
            "agl/rollout/succeeded": float(succeeded),
            "agl/rollout/failed": float(failed),
            "agl/rollout/groups": float(len(records)),
            "agl/rollout/hook_events": float(hook_events),
        }
        if self.judge is not None:
            metrics.update(self.judge.take_cost().metrics())
        metrics.update(_stats("agl/rollout/queue_wait_s", queue_wait))
        metrics.update(_stats("agl/rollout/run_time_s", run_time))
        metrics.update(_stats("agl/async/consumed_age", ages))
        return StepResult(traces, chosen, metrics, counts, judge_failures)
