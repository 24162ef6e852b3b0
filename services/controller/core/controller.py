"""The controller loop: follow the ledger's queuing stream, claim with compare-and-set, launch, report.

Rollouts arrive by the WatchRollouts(states=[QUEUING]) stream (never by polling). Each one is claimed
(queuing -> running with attempt id, launcher reference and controller id, compare-and-set on its version)
before anything is launched, so two controllers never launch one rollout. At most max_concurrency attempts
run at once; the next queued rollout starts the moment one ends.

Liveness: the controller heartbeats a lease in the ledger (lease_keeper.py). When another controller's lease
expires while it owns RUNNING rollouts, this one takes them over: it claims each (running -> running under its own
id, compare-and-set, so one live controller wins) and then does what a restart of the dead one would have done,
adopting a Job that still runs or failing an attempt whose local process it cannot see (reason LOST, which the
rollout's retry policy may turn into a new attempt).

Claiming, reporting and taking over all read and change the same waiting queue, running tasks and concurrency
slots of the one Controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Mapping

from services._gen.agl.v1 import rollout_pb2
from services.client import (
    ROLLOUTS,
    Conflict,
    FailedPrecondition,
    Handler,
    Informer,
    LedgerClient,
    LedgerError,
    NotFound,
    Refused,
    Transient,
    backoff_s,
)
from services.printable import printable

from .lease_keeper import Lease, LeaseKeeper, stopped_heartbeating
from .metrics import ControllerMetrics
from .outcome import INTERNAL, INVALID_CONFIG, SHUTDOWN, ConfigError, Outcome
from .readiness import Readiness
from .returned_reward import post_returned_reward
from .runner import LaunchPlan, Runner

log = logging.getLogger(__name__)

QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED

# The claim lost: someone else changed or took the rollout.
_LOST = (Conflict, FailedPrecondition, NotFound)
SHUTDOWN_REASON = "controller shutdown"


class Controller:
    def __init__(
        self,
        ledger: LedgerClient,
        runner: Runner,
        *,
        controller_id: str,
        max_concurrency: int,
        metrics: ControllerMetrics,
        label_selector: Mapping[str, str] | None = None,
        report_retry_s: float = 600.0,
        shutdown_timeout_s: float = 30.0,
        readiness: Readiness | None = None,
        lease_ttl_s: float = 30.0,
    ) -> None:
        self._ledger = ledger
        self._runner = runner
        self._id = controller_id
        self._max = max(1, max_concurrency)
        self._metrics = metrics
        self._labels = dict(label_selector or {})
        self._report_retry_s = report_retry_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._pending: dict[str, rollout_pb2.Rollout] = {}
        self._live: dict[str, asyncio.Task[None]] = {}
        # Rollouts queued again for a retry whose backoff has not passed: offered when it has.
        self._waiting: dict[str, asyncio.TimerHandle] = {}
        self._stopping = False
        self._readiness = readiness or Readiness(ledger.address)
        self.leases = LeaseKeeper(ledger, controller_id, lease_ttl_s, self._take_over_from)
        self._taking: set[str] = set()  # controllers whose rollouts are being listed for a takeover
        # Claims whose answer was lost with the ledger's connection (rollout -> attempt id): the claim may have applied,
        # so the retry claims with the same attempt id and its re-read knows the rollout for its own. A new id would
        # leave it running an attempt nobody runs, for as long as this controller holds its lease.
        self._unconfirmed_claims: dict[str, str] = {}

    # -- main loop -------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Runs until `stop` is set (or the queuing stream fails for good), then shuts down."""
        await self._runner.start()
        watch: asyncio.Task[None] | None = None
        heartbeat = asyncio.create_task(self.leases.run(), name="lease-heartbeat")
        try:
            stopper = asyncio.create_task(stop.wait())
            recovered = asyncio.create_task(self._recover())
            await asyncio.wait({stopper, recovered}, return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                recovered.result()
                watch = asyncio.create_task(self._watch(), name="watch-queuing")
                await asyncio.wait({stopper, watch}, return_when=asyncio.FIRST_COMPLETED)
            recovered.cancel()
            stopper.cancel()
        finally:
            await self._shutdown(watch, heartbeat)
        if watch is not None and watch.done() and not watch.cancelled() and watch.exception() is not None:
            raise watch.exception()  # type: ignore[misc]

    async def _recover(self) -> None:
        """Rollouts an earlier run of this controller left running: the runner adopts them or explains the loss."""
        refusals = 0
        while True:
            try:
                rollouts = await self._ledger.list_rollouts(states=[RUNNING], controller_id=self._id)
                self._readiness.succeeded()
                break
            except (Transient, Refused) as err:
                self._readiness.failed(err)  # one line per change of state, not one per retry
                refusals = refusals + 1 if isinstance(err, Refused) else 0
                await asyncio.sleep(backoff_s(refusals) if refusals else 1.0)
        if rollouts:
            log.info("reconciling %d rollout(s) left running by controller %s", len(rollouts), self._id)
        for rollout in rollouts:
            self._start_task(rollout.rollout_id, self._resume(rollout))

    async def _watch(self) -> None:
        """Follows the queue; a key the ledger starts refusing is one line, not ready, and a backoff, not an exit."""
        refusals = 0
        while True:
            try:
                await self._follow_queue()
            except Refused as err:
                refusals = 1 if self._readiness.subscribed else refusals + 1
                self._readiness.subscribed = False
                self._readiness.failed(err)
                self._forget_queue()  # the watch starts over with a fresh snapshot once the key is accepted
                await asyncio.sleep(backoff_s(refusals))

    async def _follow_queue(self) -> None:
        """The queue is an informer over WatchRollouts(states=[QUEUING]); `_QueueEvents` turns its news into offers.
        Snapshot items are offered as they arrive, so launching starts before a long snapshot is complete."""
        watch = functools.partial(self._ledger.watch_rollouts, states=[QUEUING], labels=self._labels)
        await Informer(watch, ROLLOUTS, _QueueEvents(self), keep=lambda r: r.status.state == QUEUING).run()

    def _forget_queue(self) -> None:
        """The informer starts over with a fresh snapshot: what we hold may be stale."""
        self._pending.clear()
        for rollout_id in list(self._waiting):
            self._drop_waiting(rollout_id)

    def _left_queue(self, rollout_id: str) -> None:
        self._pending.pop(rollout_id, None)
        self._drop_waiting(rollout_id)

    def _offer(self, rollout: rollout_pb2.Rollout) -> None:
        # Kept even while a handler for the same rollout runs: a claim that lost to a newer version of a still
        # queuing rollout is retried with that version once the handler is done.
        rollout_id = rollout.rollout_id
        self._drop_waiting(rollout_id)
        wait_s = (
            rollout.status.retry_time.ToNanoseconds() / 1e9 - time.time()
            if rollout.status.HasField("retry_time")
            else 0.0
        )
        if wait_s > 0:  # queued again for a retry: not before the policy's backoff
            self._waiting[rollout_id] = asyncio.get_running_loop().call_later(wait_s, self._offer_waited, rollout)
            return
        self._pending[rollout_id] = rollout

    def _offer_waited(self, rollout: rollout_pb2.Rollout) -> None:
        self._waiting.pop(rollout.rollout_id, None)
        if not self._stopping:
            self._pending[rollout.rollout_id] = rollout
            self._fill()

    def _drop_waiting(self, rollout_id: str) -> None:
        handle = self._waiting.pop(rollout_id, None)
        if handle is not None:
            handle.cancel()

    def _offer_later(self, rollout: rollout_pb2.Rollout, delay_s: float = 1.0) -> None:
        """After a transient ledger error: try the rollout again in a moment (the claim is a CAS, so it is safe)."""

        def offer() -> None:
            if not self._stopping and rollout.rollout_id not in self._pending:
                self._offer(rollout)
                self._fill()

        asyncio.get_running_loop().call_later(delay_s, offer)

    def _fill(self) -> None:
        """Starts queued rollouts while slots are free (called on every change and whenever a slot frees)."""
        busy: list[rollout_pb2.Rollout] = []
        while self._pending and len(self._live) < self._max and not self._stopping:
            rollout_id = next(iter(self._pending))
            rollout = self._pending.pop(rollout_id)
            if rollout_id in self._live:
                busy.append(rollout)
            else:
                self._start_task(rollout_id, self._handle(rollout))
        for rollout in busy:
            self._pending[rollout.rollout_id] = rollout

    def _start_task(self, rollout_id: str, coro: object) -> None:
        task = asyncio.create_task(coro, name=f"rollout-{rollout_id}")  # type: ignore[arg-type]
        self._live[rollout_id] = task
        task.add_done_callback(lambda done: self._task_done(rollout_id, done))

    def _task_done(self, rollout_id: str, task: asyncio.Task[None]) -> None:
        if self._live.get(rollout_id) is task:
            del self._live[rollout_id]
        if not task.cancelled() and (err := task.exception()) is not None:
            log.error("rollout %s: handler crashed: %r", rollout_id, err, exc_info=err)
        self._fill()

    # -- one rollout -----------------------------------------------------------------------------------------

    async def _handle(self, rollout: rollout_pb2.Rollout) -> None:
        rollout_id = rollout.rollout_id
        attempt_id = self._unconfirmed_claims.pop(rollout_id, None) or uuid.uuid4().hex
        try:
            plan = await self._runner.prepare(rollout, attempt_id)
        except ConfigError as err:
            await self._fail_queued(rollout, str(err))
            return
        except Exception as err:  # a config the checks above missed must not leave the rollout queued forever
            log.exception("rollout %s: cannot prepare its launch", rollout_id)
            await self._fail_queued(rollout, f"unusable rollout config: {type(err).__name__}: {err}")
            return
        await self._runner.admit()
        if self._stopping:
            return
        claim = asyncio.create_task(self._claim(rollout, plan))
        try:
            claimed = await asyncio.shield(claim)
        except asyncio.CancelledError:
            if await claim:
                await self._report(rollout_id, plan.attempt_id, Outcome.failure(SHUTDOWN, SHUTDOWN_REASON))
            raise
        if not claimed:
            return
        await self._run(plan, rollout)

    async def _resume(self, rollout: rollout_pb2.Rollout, cause: str = "") -> None:
        self._metrics.running.inc()
        try:
            outcome = await self._runner.resume(rollout, cause)
        finally:
            self._metrics.running.dec()
        await self._report(rollout.rollout_id, rollout.status.attempt_id, outcome)

    async def _claim(self, rollout: rollout_pb2.Rollout, plan: LaunchPlan) -> bool:
        rollout_id = rollout.rollout_id
        try:
            await self._ledger.update_status(
                rollout_id,
                RUNNING,
                attempt_id=plan.attempt_id,
                launcher_ref=plan.launcher_ref,
                controller_id=self._id,
                expected_version=rollout.status.version,
            )
            log.info("rollout %s: claimed (attempt %s)", rollout_id, plan.attempt_id)
            return True
        except LedgerError as err:
            refusal = err
        # A retried claim whose first try applied also ends here: the rollout then is ours.
        try:
            current = await self._ledger.get_rollout(rollout_id)
        except LedgerError as err:
            if not isinstance(refusal, _LOST):
                log.warning("rollout %s: claim failed (%s: %s), state unknown (%s)", rollout_id, refusal.code_name,
                            refusal.details(), err.code_name)  # fmt: skip
                self._unconfirmed_claims[rollout_id] = plan.attempt_id
                self._offer_later(rollout)
            return False
        status = current.status
        if status.state == RUNNING and status.attempt_id == plan.attempt_id and status.controller_id == self._id:
            log.info("rollout %s: claimed (attempt %s, confirmed on re-read)", rollout_id, plan.attempt_id)
            return True
        if isinstance(refusal, _LOST):
            self._metrics.claim_conflicts.inc()
            log.debug("rollout %s: taken by someone else (%s)", rollout_id, refusal.code_name)
        else:
            log.warning("rollout %s: claim failed: %s: %s", rollout_id, refusal.code_name, refusal.details())
            if status.state == QUEUING:
                self._offer_later(current)
        return False

    async def _fail_queued(self, rollout: rollout_pb2.Rollout, reason: str) -> None:
        """An unusable config fails the rollout at once (queuing -> failed), unless someone else got to it."""
        rollout_id = rollout.rollout_id
        try:
            await self._ledger.update_status(
                rollout_id,
                FAILED,
                error_message=reason,
                controller_id=self._id,
                expected_version=rollout.status.version,
                failure_reason=rollout_pb2.FAILURE_REASON_INVALID_CONFIG,
            )
        except _LOST:
            return
        except LedgerError as err:
            log.warning("rollout %s: could not fail it (%s): %s", rollout_id, err.code_name, err.details())
            self._offer_later(rollout)
            return
        self._metrics.rollouts_failed.labels(INVALID_CONFIG).inc()
        log.info("rollout %s: failed before launch: %s", rollout_id, printable(reason))

    async def _run(self, plan: LaunchPlan, rollout: rollout_pb2.Rollout) -> None:
        def on_launched(mode: str) -> None:
            self._metrics.launched.labels(mode).inc()
            enqueued = rollout.status.create_time.ToNanoseconds() / 1e9
            if enqueued > 0:
                self._metrics.launch_latency.observe(max(time.time() - enqueued, 0.0))

        self._metrics.running.inc()
        try:
            outcome = await self._runner.run(plan, on_launched)
        except asyncio.CancelledError:
            # Local agents die with the controller. A Job (even one whose creation was in flight) is left to the
            # next run, which adopts it or reports it missing.
            if self._runner.kills_on_shutdown:
                shutdown = Outcome.failure(SHUTDOWN, SHUTDOWN_REASON)
                await asyncio.shield(self._report(plan.rollout_id, plan.attempt_id, shutdown))
            raise
        except Exception as err:
            log.exception("rollout %s: runner error", plan.rollout_id)
            outcome = Outcome.failure(INTERNAL, f"controller error: {type(err).__name__}: {err}")
        finally:
            self._metrics.running.dec()
        if outcome.succeeded and outcome.returned_reward is not None:  # posted before the trainer hears it succeeded
            await post_returned_reward(self._ledger, plan.rollout_id, plan.attempt_id, outcome.returned_reward)
        await self._report(plan.rollout_id, plan.attempt_id, outcome)

    async def _report(self, rollout_id: str, attempt_id: str, outcome: Outcome) -> None:
        """Reports how the attempt ended. The ledger decides whether a failure ends the rollout or, under its retry
        policy, puts it back in the queue for its next attempt."""
        state = SUCCEEDED if outcome.succeeded else FAILED
        deadline = time.monotonic() + self._report_retry_s
        while True:
            try:
                rollout = await self._ledger.update_status(
                    rollout_id,
                    state,
                    error_message=outcome.reason,
                    failure_reason=outcome.failure_reason,
                    ending_attempt_id=attempt_id,
                )
                break
            except LedgerError as err:
                if isinstance(err, Transient) and time.monotonic() < deadline:
                    await asyncio.sleep(1.0)
                    continue
                if isinstance(err, FailedPrecondition) and (
                    rollout := await self._already(rollout_id, attempt_id, state)
                ):
                    break  # a retry whose first try had applied
                log.warning(
                    "rollout %s: could not report %s of attempt %s (%s: %s)",
                    rollout_id,
                    rollout_pb2.RolloutState.Name(state),
                    attempt_id,
                    err.code_name,
                    err.details(),
                )
                return
        number = next((a.number for a in rollout.status.attempts if a.attempt_id == attempt_id), 0)
        reason = "succeeded" if outcome.succeeded else (outcome.kind or "other")
        self._metrics.attempts_ended.labels(reason, str(min(number, 10))).inc()
        if outcome.succeeded:
            log.info("rollout %s: succeeded (attempt %s)", rollout_id, attempt_id)
        elif rollout.status.state == QUEUING:
            self._metrics.retried.labels(reason).inc()
            log.info(
                "rollout %s: attempt %s (#%d) failed: %s; queued for attempt %d",
                rollout_id, attempt_id, number, printable(outcome.reason), len(rollout.status.attempts) + 1,
            )  # fmt: skip
        else:
            self._metrics.rollouts_failed.labels(reason).inc()
            log.info("rollout %s: failed (attempt %s): %s", rollout_id, attempt_id, printable(outcome.reason))

    async def _already(self, rollout_id: str, attempt_id: str, state: int) -> rollout_pb2.Rollout | None:
        """The rollout when the attempt's end was recorded already (an earlier try applied), else None."""
        try:
            rollout = await self._ledger.get_rollout(rollout_id)
        except LedgerError:
            return None
        for attempt in rollout.status.attempts:
            if attempt.attempt_id == attempt_id:
                return rollout if attempt.state == state else None
        return rollout if rollout.status.state == state else None

    # -- takeover of dead controllers' rollouts ------------------------------------------------------------

    def _take_over_from(self, leases: list[Lease]) -> None:
        """Called with the expired leases a heartbeat returned."""
        for lease in leases:
            if self._stopping or lease.controller_id in self._taking or lease.controller_id == self._id:
                continue
            self._taking.add(lease.controller_id)
            task = asyncio.create_task(self._take_over_all(lease), name=f"take-over-{lease.controller_id}")
            task.add_done_callback(lambda _, cid=lease.controller_id: self._taking.discard(cid))

    async def _take_over_all(self, lease: Lease) -> None:
        try:
            rollouts = await self._ledger.list_rollouts(states=[RUNNING], controller_id=lease.controller_id)
        except LedgerError as err:  # the next heartbeat reports the lease again
            log.warning("listing controller %s's rollouts failed (%s)", lease.controller_id, err.code_name)
            return
        if rollouts and not self._stopping:
            log.info("%s: taking over its %d running rollout(s)", stopped_heartbeating(lease), len(rollouts))
        for rollout in rollouts:
            if not self._stopping and rollout.rollout_id not in self._live:
                self._start_task(rollout.rollout_id, self._take_over(rollout, lease))

    async def _take_over(self, rollout: rollout_pb2.Rollout, lease: Lease) -> None:
        rollout_id = rollout.rollout_id
        try:
            claimed = await self._ledger.update_status(
                rollout_id, RUNNING, controller_id=self._id, expected_version=rollout.status.version
            )
        except _LOST as err:
            log.debug("rollout %s: taken over by someone else or ended (%s)", rollout_id, err.code_name)
            return
        except LedgerError as err:
            log.warning("rollout %s: takeover claim failed (%s: %s)", rollout_id, err.code_name, err.details())
            return
        self._metrics.takeovers.inc()
        log.info("rollout %s: taken over from controller %s (attempt %s)", rollout_id, lease.controller_id,
                 claimed.status.attempt_id)  # fmt: skip
        await self._resume(claimed, stopped_heartbeating(lease))

    # -- shutdown --------------------------------------------------------------------------------------------

    async def _shutdown(self, watch: asyncio.Task[None] | None, heartbeat: asyncio.Task[None]) -> None:
        """Stop claiming; local agents are killed and their rollouts failed, Jobs are left for the next run (or for
        a live controller, which takes them over once this one's lease has ended)."""
        self._stopping = True
        self._pending.clear()
        for rollout_id in list(self._waiting):
            self._drop_waiting(rollout_id)
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
        tasks = list(self._live.values())
        if tasks:
            log.info("shutting down: stopping %d live rollout(s)", len(tasks))
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=self._shutdown_timeout_s)
        heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await heartbeat
        await self.leases.leave()
        await self._runner.close()


class _QueueEvents(Handler[rollout_pb2.Rollout]):
    """The queue informer's news, as the controller's offers (every change may free or fill a slot: `_fill`)."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    def on_relist(self) -> None:
        self._controller._forget_queue()

    def on_snapshot_item(self, item: rollout_pb2.Rollout) -> None:
        self._controller._offer(item)
        self._controller._fill()

    def on_synced(self, replaced: bool) -> None:
        self._controller._readiness.subscribed = True
        self._controller._readiness.succeeded()
        self._controller._fill()

    def on_upsert(self, old: rollout_pb2.Rollout | None, new: rollout_pb2.Rollout) -> None:
        if new.status.state == QUEUING:
            self._controller._offer(new)
        else:
            self._controller._left_queue(new.rollout_id)
        self._controller._fill()

    def on_delete(self, old: rollout_pb2.Rollout | None, gone: rollout_pb2.Rollout) -> None:
        self._controller._left_queue(gone.rollout_id)
        self._controller._fill()
