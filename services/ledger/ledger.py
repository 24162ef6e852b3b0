"""The ledger core: rollouts and their state machine, events, the terminal log and the watches' sources.

All state lives in memory and is changed only from the event loop's thread, so operations are atomic without
locks: each one validates everything, changes memory and hands the change to the store in one synchronous
step, then awaits durability before returning (a write is acknowledged only once durable). Watches are fed
synchronously at change time and deliver a change only after it is durable.

Every operation validates, changes the shared in-memory maps and hands the change to the store in one synchronous
step: that is what makes it atomic without locks, and why the operations share this module.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from services._gen.agl.v1 import (
    controller_lease_pb2,
    event_pb2,
    ledger_service_pb2,
    model_pb2,
    proxy_control_pb2,
    rollout_pb2,
)
from services.printable import printable

from . import attempts, states
from .controller_leases import ControllerLeases
from .entry import Entry
from .errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from .hub import Change, RolloutFilter, RolloutHub
from .model_registry import ModelRegistry
from .paging import page_size, parse_token
from .proxy_control import ProxyControlState
from .quotas import EventQuotas
from .repeats import Uncommitted, check_repeat
from .runs import RunBook
from .staging import stage
from .store import DELETE_MODEL, DELETE_ROLLOUT, PUT_META, PUT_MODEL, PUT_ROLLOUT, Op, Store
from .terminal_log import TerminalLog
from .triplet import view as triplet_view
from .validation import check_event, check_safe_id, check_spec

log = logging.getLogger(__name__)

UPSERT = ledger_service_pb2.ROLLOUT_CHANGE_TYPE_UPSERT
DELETE = ledger_service_pb2.ROLLOUT_CHANGE_TYPE_DELETE
UNSPECIFIED = rollout_pb2.ROLLOUT_STATE_UNSPECIFIED
TRIPLET = event_pb2.EVENT_VIEW_TRIPLET
ALL_ATTEMPTS = "*"

META_REVISION = "revision"
META_TERMINAL_CURSOR = "terminal_cursor"
META_MODELS_REVISION = "models_revision"
META_PROXY_CONTROL = "proxy_control"


def _within(rows: list[Any], size: int, max_bytes: int, length: Callable[[Any], int]) -> int:
    """How many of `rows` one page takes: at most `size`, and no more bytes than `max_bytes` (at least one row)."""
    total = 0
    for i, row in enumerate(rows[:size]):
        total += length(row) + 8  # + the field's tag and length
        if total > max_bytes and i > 0:
            return i
    return min(len(rows), size)


class Ledger:
    def __init__(
        self,
        store: Store,
        *,
        ring_size: int = 50_000,
        watch_buffer: int = 8192,
        page_bytes: int = 60 * 1024 * 1024,
        quotas: EventQuotas | None = None,
    ) -> None:
        self.store = store
        self.quotas = quotas or EventQuotas()
        self.quota_refusals: collections.Counter[str] = collections.Counter()  # appends refused, by limit
        # Most bytes of events or rollouts one page carries (at least one item): a page must fit in one gRPC message.
        self.page_bytes = page_bytes
        self.rollouts: dict[str, Entry] = {}
        self.revision = 0
        self.last_lsn = 0
        self.events_appended = 0
        self.state_counts: collections.Counter[int] = collections.Counter()
        self.retries: collections.Counter[int] = collections.Counter()  # attempts retried, by failure reason
        self.terminal = TerminalLog()
        self.models = ModelRegistry()
        self.proxy = ProxyControlState(on_lifted=self._pause_lifted)
        self.controllers = ControllerLeases()
        self.stream_counts: collections.Counter[str] = collections.Counter()
        self.uncommitted = Uncommitted()  # events with an id not yet readable from the store
        self._ring_size = ring_size
        self._watch_buffer = watch_buffer
        self.hub = RolloutHub(0, ring_size, watch_buffer)
        self.runs = RunBook(self._write, self.durable, ring_size=ring_size, watch_buffer=watch_buffer)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Restore what the store kept (rollouts, event indexes, terminal log, models, counters, pause state)."""
        loaded = self.store.load()
        terminal: list[tuple[int, str]] = []
        revision = int(loaded.meta.get(META_REVISION, 0))
        for stored in loaded.rollouts:
            rollout = rollout_pb2.Rollout.FromString(stored.data)
            self.rollouts[stored.rollout_id] = Entry(rollout, stored.ordinal, stored.terminal_cursor)
            self.state_counts[rollout.status.state] += 1
            self.controllers.moved("", False, rollout.status.controller_id, rollout.status.state == states.RUNNING)
            revision = max(revision, rollout.status.revision, stored.ordinal)
            if stored.terminal_cursor is not None:
                terminal.append((stored.terminal_cursor, stored.rollout_id))
        for rollout_id, head in loaded.event_heads.items():
            entry = self.rollouts.get(rollout_id)
            if entry is not None:
                entry.next_seq = head + 1
        for rollout_id, size in loaded.event_bytes.items():
            entry = self.rollouts.get(rollout_id)
            if entry is not None:
                entry.event_bytes = size
        for rollout_id, event_id, seq, attempt_id in loaded.event_ids:
            entry = self.rollouts.get(rollout_id)
            if entry is not None:
                if entry.event_ids is None:
                    entry.event_ids = {}
                entry.event_ids[event_id] = (seq, attempt_id)
        self.terminal = TerminalLog(int(loaded.meta.get(META_TERMINAL_CURSOR, 0)))
        for cursor, rollout_id in sorted(terminal):
            self.terminal.restore(cursor, rollout_id)
        self.revision = revision
        self.hub = RolloutHub(revision, self._ring_size, self._watch_buffer)
        self.models = ModelRegistry(int(loaded.meta.get(META_MODELS_REVISION, 0)))
        for data in loaded.models:
            self.models.restore(model_pb2.ModelEndpoint.FromString(data))
        control = loaded.meta.get(META_PROXY_CONTROL)
        if isinstance(control, bytes):
            self.proxy.restore(proxy_control_pb2.ProxyControl.FromString(control))
        self.runs.load(loaded)
        events = sum(e.next_seq - 1 for e in self.rollouts.values())
        log.info(
            "ledger loaded: %d rollouts, %d events, %d terminal entries, %d model endpoints, revision %d",
            len(self.rollouts), events, len(self.terminal), len(self.models.list()), revision,
        )  # fmt: skip

    async def close(self) -> None:
        await self.store.close()

    def _write(self, ops: list[Op]) -> int:
        self.last_lsn = self.store.write(ops)
        return self.last_lsn

    async def durable(self, lsn: int) -> None:
        if lsn > self.store.committed_lsn:
            await self.store.wait(lsn)

    def entry(self, rollout_id: str) -> Entry:
        entry = self.rollouts.get(rollout_id)
        if entry is None:
            raise NotFound(f"rollout {rollout_id} not found")
        return entry

    # -- rollouts --------------------------------------------------------------------------------------------------

    async def create_rollouts(self, specs: list[rollout_pb2.RolloutSpec]) -> list[tuple[rollout_pb2.Rollout, bool]]:
        for i, spec in enumerate(specs):
            check_spec(spec, i)
        now = time.time_ns()
        results: list[tuple[rollout_pb2.Rollout, bool]] = []
        created: list[Entry] = []
        ops: list[Op] = []
        wait_for = 0
        for spec in specs:
            rollout_id = spec.rollout_id or uuid.uuid4().hex
            existing = self.rollouts.get(rollout_id)
            if existing is not None:
                results.append((existing.rollout, False))
                wait_for = max(wait_for, existing.lsn)
                continue
            self.revision += 1
            rollout = rollout_pb2.Rollout(
                rollout_id=rollout_id,
                input_json=spec.input_json,
                is_train=spec.is_train,
                config=spec.config,
                metadata=spec.metadata,
            )
            status = rollout.status
            status.state = states.QUEUING
            status.version = 1
            status.revision = self.revision
            status.create_time.FromNanoseconds(now)
            status.update_time.FromNanoseconds(now)
            entry = Entry(rollout, self.revision)
            self.rollouts[rollout_id] = entry
            created.append(entry)
            results.append((rollout, True))
            ops.append((PUT_ROLLOUT, rollout_id, entry.ordinal, None, rollout.SerializeToString()))
        if ops:
            ops.append((PUT_META, META_REVISION, self.revision))
            lsn = self._write(ops)
            self.state_counts[states.QUEUING] += len(created)
            for entry in created:
                entry.lsn = lsn
                self.hub.publish(Change(entry.ordinal, UPSERT, entry.rollout, UNSPECIFIED, lsn))
            wait_for = lsn
            log.debug("created %d rollouts: %s", len(created), ", ".join(e.rollout.rollout_id for e in created))
        await self.durable(wait_for)
        return results

    async def get_rollout(self, rollout_id: str) -> rollout_pb2.Rollout:
        entry = self.entry(rollout_id)
        await self.durable(entry.lsn)
        return entry.rollout

    async def list_rollouts(
        self, state_filter: Iterable[int], labels: Mapping[str, str], controller_id: str, size: int, token: str
    ) -> tuple[list[rollout_pb2.Rollout], str]:
        size = page_size(size, 100, 1000)
        after = parse_token(token)
        rollout_filter = RolloutFilter(state_filter, labels)
        out: list[rollout_pb2.Rollout] = []
        more = False
        lsn = 0
        after_ordinal = after
        budget = self.page_bytes
        for entry in self.rollouts.values():
            if entry.ordinal <= after:
                continue
            rollout = entry.rollout
            if not rollout_filter.matches(rollout):
                continue
            if controller_id and rollout.status.controller_id != controller_id:
                continue
            if len(out) == size:
                more = True
                break
            budget -= rollout.ByteSize() + 8
            if budget < 0 and out:
                more = True
                break
            out.append(rollout)
            lsn = max(lsn, entry.lsn)
            after_ordinal = entry.ordinal
        await self.durable(lsn)
        return out, (str(after_ordinal) if more else "")

    async def delete_rollouts(self, rollout_ids: Iterable[str]) -> int:
        ops: list[Op] = []
        changes: list[Change] = []
        for rollout_id in dict.fromkeys(rollout_ids):
            entry = self.rollouts.pop(rollout_id, None)
            if entry is None:
                continue
            self.revision += 1
            self.terminal.remove(rollout_id)
            status = entry.rollout.status
            self.state_counts[status.state] -= 1
            self.controllers.moved(status.controller_id, status.state == states.RUNNING, "", False)
            ops.append((DELETE_ROLLOUT, rollout_id))
            changes.append(Change(self.revision, DELETE, entry.rollout, entry.rollout.status.state, 0))
        if not ops:
            await self.durable(self.last_lsn)
            return 0
        ops.append((PUT_META, META_REVISION, self.revision))
        lsn = self._write(ops)
        for change in changes:
            self.hub.publish(Change(change.revision, DELETE, change.rollout, change.previous_state, lsn))
        log.debug("deleted %d rollouts", len(changes))
        await self.durable(lsn)
        return len(changes)

    async def update_status(
        self,
        rollout_id: str,
        state: int,
        *,
        error_message: str = "",
        attempt_id: str = "",
        launcher_ref: str = "",
        controller_id: str = "",
        expected_version: int | None = None,
        failure_reason: int = 0,
        ending_attempt_id: str = "",
    ) -> rollout_pb2.Rollout:
        """Move a rollout along its state machine. FAILED for a running attempt whose failure the rollout's retry
        policy retries becomes a new wait in the queue instead (the returned rollout shows QUEUING)."""
        where = f"rollout {rollout_id}"
        check_safe_id(attempt_id, "attempt_id", where)
        check_safe_id(ending_attempt_id, "ending_attempt_id", where)
        attempts.check_reason(failure_reason, where)
        if failure_reason and state != states.FAILED:
            raise InvalidArgument(f"{where}: failure_reason is given only with state failed")
        entry = self.entry(rollout_id)
        current = entry.rollout
        if expected_version is not None and current.status.version != expected_version:
            raise Aborted(f"rollout {rollout_id}: version is {current.status.version}, expected {expected_version}")
        previous_state = current.status.state
        states.check_transition(rollout_id, previous_state, state)
        terminal = states.is_terminal(state)
        if ending_attempt_id and (
            not terminal or previous_state != states.RUNNING or ending_attempt_id != current.status.attempt_id
        ):
            raise FailedPrecondition(
                f"{where}: attempt {ending_attempt_id} is not its running attempt (the rollout is "
                f"{states.state_name(previous_state)}, attempt {current.status.attempt_id!r}); it cannot end it"
            )
        if attempt_id and attempt_id != current.status.attempt_id and attempts.known(current.status, attempt_id):
            raise FailedPrecondition(f"{where}: attempt id {attempt_id} was used before; a new attempt needs a new id")
        now = time.time_ns()
        rollout = rollout_pb2.Rollout()
        rollout.CopyFrom(current)
        status = rollout.status
        self._record_attempt(status, previous_state, state, attempt_id, launcher_ref, now)
        retry = (
            state == states.FAILED
            and previous_state == states.RUNNING
            and attempts.retries(rollout.config.retry, failure_reason, len(status.attempts))
        )
        if terminal and previous_state == states.RUNNING and (ended := attempts.running(status)) is not None:
            attempts.finish(ended, state, failure_reason, error_message, now)
        status.state = states.QUEUING if retry else state
        if error_message:
            status.error_message = error_message
        if attempt_id:
            status.attempt_id = attempt_id
        if launcher_ref:
            status.launcher_ref = launcher_ref
        if controller_id:
            status.controller_id = controller_id
        if state == states.FAILED:
            status.failure_reason = failure_reason
        status.version += 1
        self.revision += 1
        status.revision = self.revision
        status.update_time.FromNanoseconds(now)
        if state == states.RUNNING and previous_state != states.RUNNING:
            status.start_time.FromNanoseconds(now)
            status.ClearField("retry_time")
        if retry:
            # The superseded attempt's agent is refused from now on (no current attempt until the next claim).
            status.attempt_id = ""
            status.launcher_ref = ""
            status.retry_time.FromNanoseconds(
                now + int(attempts.backoff_seconds(rollout.config.retry, len(status.attempts)) * 1e9)
            )
            terminal = False
        if terminal:
            status.end_time.FromNanoseconds(now)
            entry.terminal_cursor = self.terminal.next_cursor()
        ops: list[Op] = [
            (PUT_ROLLOUT, rollout_id, entry.ordinal, entry.terminal_cursor, rollout.SerializeToString()),
            (PUT_META, META_REVISION, self.revision),
        ]
        if terminal:
            ops.append((PUT_META, META_TERMINAL_CURSOR, entry.terminal_cursor))
        lsn = self._write(ops)
        if current.status.attempt_id and current.status.attempt_id != status.attempt_id:
            if entry.past_attempts is None:
                entry.past_attempts = set()
            entry.past_attempts.add(current.status.attempt_id)
        entry.rollout = rollout
        entry.lsn = lsn
        self.state_counts[previous_state] -= 1
        self.state_counts[status.state] += 1
        before, after = current.status.controller_id, status.controller_id
        self.controllers.moved(before, previous_state == states.RUNNING, after, status.state == states.RUNNING)
        if retry:
            self.retries[failure_reason] += 1
        if terminal:
            self.terminal.append(rollout_id)
        self.hub.publish(Change(self.revision, UPSERT, rollout, previous_state, lsn))
        log.info(
            "rollout %s: %s -> %s (attempt %s, version %d)%s%s",
            rollout_id, states.state_name(previous_state), states.state_name(status.state),
            attempt_id or current.status.attempt_id, status.version,
            f": {printable(error_message)}" if error_message else "",
            f"; attempt {len(status.attempts) + 1} follows ({attempts.reason_name(failure_reason)})" if retry else "",
        )  # fmt: skip
        await self.durable(lsn)
        return rollout

    @staticmethod
    def _record_attempt(
        status: rollout_pb2.RolloutStatus, previous: int, state: int, attempt_id: str, launcher_ref: str, now: int
    ) -> None:
        """Keep `status.attempts` in step with a claim (a new attempt) or a running attempt's new id or handle."""
        if state != states.RUNNING:
            return
        if previous != states.RUNNING:
            attempts.start(status, attempt_id, launcher_ref, now)
            return
        record = attempts.running(status)
        if record is None:
            return
        if attempt_id and attempt_id != record.attempt_id:
            if record.attempt_id:  # replaced while running: the old one ended
                attempts.finish(record, states.FAILED, 0, f"superseded by attempt {attempt_id}", now)
                attempts.start(status, attempt_id, launcher_ref or record.launcher_ref, now)
                return
            record.attempt_id = attempt_id
        if launcher_ref:
            record.launcher_ref = launcher_ref

    # -- events ----------------------------------------------------------------------------------------------------

    async def append_events(
        self, events: list[event_pb2.Event], allow_terminal: bool = False
    ) -> tuple[list[int], list[str]]:
        """Append atomically: every event is validated before anything is stored. Returns once durable. A terminal
        rollout refuses events (FailedPrecondition) unless `allow_terminal` is set; an event past one of its
        rollout's limits is refused with QuotaExceeded (quotas.py), unless `allow_terminal` is set."""
        sequences, attempts, lsn = self.stage_events(events, allow_terminal)
        await self.durable(lsn)
        return sequences, attempts

    def stage_events(
        self, events: list[event_pb2.Event], allow_terminal: bool = False
    ) -> tuple[list[int], list[str], int]:
        """The synchronous part of `append_events`: validate, stamp, hand to the store. The caller must await
        `durable(lsn)` before acknowledging (a duplicate's original may still be committing, so the LSN is the
        latest write's even when nothing new was stored)."""
        rollouts = self.rollouts
        self.uncommitted.prune(self.store.committed_lsn)
        # An event id given twice in one request: the second is a retry only if it repeats the first unchanged
        # (a request may hold several callers' appends, so this must not depend on whether two were merged).
        firsts: dict[tuple[str, str], event_pb2.Event] | None = {} if len(events) > 1 else None
        for i, event in enumerate(events):
            check_event(event, i)
            rollout_id = event.rollout_id
            entry = rollouts.get(rollout_id)
            if entry is None:
                raise NotFound(f"events[{i}]: rollout {rollout_id} not found")
            status = entry.rollout.status
            if not allow_terminal and states.is_terminal(status.state):
                raise FailedPrecondition(
                    f"events[{i}]: rollout {event.rollout_id} is {states.state_name(status.state)}: a finished "
                    "rollout accepts no more events (a writer that belongs after the end sets allow_terminal)"
                )
            if (
                event.attempt_id
                and event.attempt_id != status.attempt_id
                and (entry.past_attempts is None or event.attempt_id not in entry.past_attempts)
                and not attempts.known(status, event.attempt_id)
            ):
                raise NotFound(
                    f"events[{i}]: rollout {event.rollout_id} has no attempt {event.attempt_id!r} "
                    f"(its attempt is {status.attempt_id!r}); events name one of the rollout's attempts or none"
                )
            event_id = event.event_id
            if event_id:
                known = entry.event_ids.get(event_id) if entry.event_ids is not None else None
                if known is not None:
                    self._check_same(event, known, entry, i)
                elif firsts is not None:
                    first = firsts.setdefault((rollout_id, event_id), event)
                    if first is not event:  # repeated within this request
                        where = f"is also events[{next(k for k, e in enumerate(events) if e is first)}] of this request"
                        check_repeat(first, event, status.attempt_id or attempts.latest(status), where, i)
        # Writers that belong after the end (allow_terminal: the trainer's hook events and training rows, master key
        # only; the proxy never sets it) are not limited: an agent that filled its rollout must not fail their
        # appends, which hold many rollouts' events in one request. Their events still count.
        quotas = None if allow_terminal else self.quotas
        staged = stage(events, rollouts, quotas, self.quota_refusals)
        if staged.ops:
            lsn = self._write(staged.ops)
            self.events_appended += len(staged.ops)
            if staged.with_ids and self.store.committed_lsn < lsn:
                self.uncommitted.add(lsn, staged.with_ids)
        return staged.sequences, staged.attempt_ids, self.last_lsn

    def _check_same(self, event: event_pb2.Event, known: tuple[int, str], entry: Entry, index: int) -> None:
        """A repeated event_id is a retry only with the same content: raise AlreadyExists when it differs from the
        stored event (read only on a repeat, so appends pay nothing; one still being committed is held in memory)."""
        seq, attempt = known
        stored = self.uncommitted.get(event.rollout_id, seq)
        if stored is None:
            rows = self.store.read_events(event.rollout_id, None, None, seq - 1, 1)
            if not rows or rows[0][0] != seq:
                return
            stored = event_pb2.Event.FromString(rows[0][1])
        check_repeat(stored, event, attempt, f"was appended before (sequence {seq})", index)

    async def list_events(
        self, rollout_id: str, attempt_id: str, event_type: str, view: int, size: int, token: str
    ) -> tuple[list[bytes], str]:
        """Serialized events of one rollout, and the next page token."""
        entry = self.entry(rollout_id)
        size = page_size(size, 1000, 10000)
        after = parse_token(token)
        attempt = None if attempt_id == ALL_ATTEMPTS else (attempt_id or attempts.latest(entry.rollout.status))
        etype = event_type or None
        if view == TRIPLET:
            rows = self.triplet_events(rollout_id, attempt, etype)
            rows = [(seq, data) for seq, data in rows if seq > after][: size + 1]
        else:
            rows = self.store.read_events(rollout_id, attempt, etype, after, size + 1, self.page_bytes)
        kept = _within(rows, size, self.page_bytes, lambda row: len(row[1]))
        more = len(rows) > kept
        rows = rows[:kept]
        return [data for _, data in rows], (str(rows[-1][0]) if more else "")

    def triplet_events(
        self, rollout_id: str, attempt: str | tuple[str, ...] | None, event_type: str | None
    ) -> list[tuple[int, bytes]]:
        """(sequence, serialized triplet form) of the rollout's events in the triplet view (trimmed at append)."""
        return triplet_view(self.store.read_triplets(rollout_id, attempt, event_type))

    # -- models ----------------------------------------------------------------------------------------------------

    async def register_models(self, endpoints: list[model_pb2.ModelEndpoint]) -> list[model_pb2.ModelEndpoint]:
        stored = self.models.upsert(endpoints, time.time_ns())
        ops: list[Op] = [(PUT_MODEL, ep.model_name, ep.endpoint, ep.SerializeToString()) for ep in stored]
        ops.append((PUT_META, META_MODELS_REVISION, self.models.revision))
        await self.durable(self._write(ops))
        for ep in stored:
            log.info("model endpoint registered: %s at %s (version %d)", ep.model_name, ep.endpoint, ep.version)
        return stored

    async def delete_models(self, keys: list[model_pb2.ModelEndpointKey]) -> int:
        found = self.models.matching(keys)
        removed = self.models.delete(found)
        if removed:
            ops: list[Op] = [(DELETE_MODEL, name, endpoint) for name, endpoint in found]
            ops.append((PUT_META, META_MODELS_REVISION, self.models.revision))
            self._write(ops)
            log.info("model endpoints deleted: %s", ", ".join(f"{n} at {e}" for n, e in found))
        await self.durable(self.last_lsn)
        return removed

    # -- proxy control ---------------------------------------------------------------------------------------------

    async def set_proxy_pause(self, request: ledger_service_pb2.SetProxyPauseRequest) -> proxy_control_pb2.ProxyControl:
        paused, owner, lease_seconds, model_name = (
            request.paused,
            request.owner,
            request.lease_seconds,
            request.model_name,
        )
        renewal = self.proxy.set_pause(
            paused, request.retry_after_seconds, request.reason, time.time_ns(), owner, lease_seconds, model_name
        )
        await self.durable(self._write([(PUT_META, META_PROXY_CONTROL, self.proxy.persisted())]))
        if renewal:
            log.debug("proxy pause renewed by %s for %gs", owner, lease_seconds)
        else:
            held = f" by {owner}" + (f" (lease {lease_seconds:g}s)" if lease_seconds else "") if owner else ""
            held = (f" for model {model_name}" if model_name else "") + held
            log.info("proxies %s%s (generation %d)%s", "paused" if paused else "resumed", held,
                     self.proxy.control.generation, f": {request.reason}" if request.reason else "")  # fmt: skip
        return self.proxy.snapshot()

    def _pause_lifted(self, reason: str) -> None:
        """A pause's lease ran out (its owner stopped renewing it): the lifted state is stored like a resume."""
        self._write([(PUT_META, META_PROXY_CONTROL, self.proxy.persisted())])
        log.warning("proxies resumed (generation %d): %s", self.proxy.control.generation, reason)

    def report_proxy_replica(
        self, request: ledger_service_pb2.ReportProxyReplicaRequest
    ) -> proxy_control_pb2.ProxyControl:
        self.proxy.report(
            request.replica_id,
            request.in_flight,
            request.observed_generation,
            request.ttl_seconds,
            request.leaving,
            time.time_ns(),
            request.model_in_flight,
        )
        return self.proxy.snapshot()

    # -- controller leases -----------------------------------------------------------------------------------------

    def renew_controller_lease(
        self, controller_id: str, ttl_seconds: float, leaving: bool
    ) -> tuple[controller_lease_pb2.ControllerLease, list[controller_lease_pb2.ControllerLease]]:
        """The caller's renewed (or, leaving, ended) lease, and the expired leases of controllers that still own
        RUNNING rollouts, for the caller to take over."""
        lease = self.controllers.renew(controller_id, ttl_seconds, leaving)
        expired = self.controllers.expired(controller_id)
        if leaving:
            log.info("controller %s left (%d running rollouts)", controller_id, lease.running_rollouts)
        return lease, expired
