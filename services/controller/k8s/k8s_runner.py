"""Kubernetes runner: one batch/v1 Job per rollout, followed by a watch plus a periodic re-list.

The watch runs in its own daemon thread (the official client blocks) and hands each change to the event
loop; it resumes from the last resourceVersion and re-lists on 410 Gone. The periodic re-list is the safety
net for anything a watch missed: a Job that finished, or vanished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services._gen.agl.v1 import rollout_pb2

from ..core.agent_env import agent_env
from ..core.outcome import JOB_FAILED, JOB_REJECTED, SPAWN_ERROR, VANISHED, ConfigError, Outcome
from ..core.runner import LaunchPlan, template_context, timeout_of
from .job_status import as_lost, describe_pods, job_outcome, lost_pod, returned_in_pods, vanished, with_detail
from .job_template import (
    ATTEMPT_ANNOTATION,
    CONTROLLER_ANNOTATION,
    MANAGED_SELECTOR,
    ROLLOUT_ANNOTATION,
    job_name,
)
from .k8s_api import KubeError, KubeJobs, ResourceExpired
from .rate_limit import TokenBucket
from .template_lanes import TemplateRenderer

# The launch mode of agl_controller_launched_total for an attempt run as a Kubernetes Job.
JOB = "job"

log = logging.getLogger(__name__)


@dataclass
class _Tracked:
    """A Job this controller waits on."""

    rollout_id: str
    attempt_id: str
    name: str
    future: asyncio.Future[Outcome]
    # Monotonic time the Job was known to exist (created or adopted); None while creation is in flight.
    created_at: float | None = None
    settling: bool = False


class K8sRunner:
    """Renders, creates and follows Jobs. Jobs outlive the controller; a restart adopts them."""

    name = "k8s"
    kills_on_shutdown = False

    def __init__(
        self,
        jobs: KubeJobs,
        *,
        agent_url: str,
        key: str | None,
        controller_id: str,
        default_timeout_s: float,
        ttl_seconds_after_finished: int,
        bucket: TokenBucket,
        reconcile_interval_s: float,
        watch_timeout_s: int = 300,
        max_create_backoff_s: float = 10.0,
        renderer: TemplateRenderer | None = None,
    ) -> None:
        self._jobs = jobs
        self._renderer = renderer or TemplateRenderer(2, timeout_s=5.0, memory_bytes=1 << 30, max_output_bytes=1 << 20)
        self._namespace = jobs.namespace
        self._agent_url = agent_url
        self._key = key
        self._controller_id = controller_id
        self._default_timeout_s = default_timeout_s
        self._ttl = ttl_seconds_after_finished
        self._bucket = bucket
        self._reconcile_interval_s = reconcile_interval_s
        self._watch_timeout_s = watch_timeout_s
        self._max_create_backoff_s = max_create_backoff_s
        self._tracked: dict[str, _Tracked] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._reconciler: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._renderer.start()
        threading.Thread(target=self._watch_loop, name="k8s-job-watch", daemon=True).start()
        self._reconciler = asyncio.create_task(self._reconcile_loop(), name="k8s-reconcile")

    async def close(self) -> None:
        self._stop.set()
        self._jobs.stop_watch()
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
        await self._renderer.close()

    # -- the runner interface --------------------------------------------------------------------------------

    async def prepare(self, rollout: rollout_pb2.Rollout, attempt_id: str) -> LaunchPlan:
        template = rollout.config.k8s.job_template
        if not template.strip():
            raise ConfigError("rollout config has no Job template (config.k8s.job_template)")
        timeout_s = timeout_of(rollout, self._default_timeout_s)
        context = template_context(rollout, attempt_id)
        manifest = await self._renderer.render(
            template,
            input_value=context["input"],
            rollout_id=rollout.rollout_id,
            attempt_id=attempt_id,
            namespace=self._namespace,
            env=agent_env(self._agent_url, rollout.rollout_id, attempt_id, rollout.is_train, self._key),
            timeout_seconds=timeout_s,
            ttl_seconds_after_finished=self._ttl,
            controller_id=self._controller_id,
            is_train=rollout.is_train,
            attempt_number=len(rollout.status.attempts) + 1,
        )
        name = manifest["metadata"]["name"]
        return LaunchPlan(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt_id,
            launcher_ref=f"job:{self._namespace}/{name}",
            timeout_s=timeout_s,
            detail=manifest,
        )

    async def admit(self) -> None:
        await self._bucket.take()

    async def run(self, plan: LaunchPlan, launched: Callable[[str], None]) -> Outcome:
        name = plan.detail["metadata"]["name"]
        tracked = self._track(plan.rollout_id, plan.attempt_id, name)
        try:
            created = await self._create(plan, name)
            if isinstance(created, Outcome):
                return created
            tracked.created_at = time.monotonic()
            launched(JOB)
            self._observe(tracked, created)  # an adopted Job may have finished already
            return await asyncio.shield(tracked.future)
        finally:
            self._tracked.pop(name, None)

    async def resume(self, rollout: rollout_pb2.Rollout, cause: str = "") -> Outcome:
        """Adopts the attempt's Job (the restart of this controller, or `cause`: a takeover) or reports it missing."""
        attempts = rollout.status.attempts
        name = job_name(rollout.rollout_id, attempts[-1].number if attempts else 1)
        tracked = self._track(rollout.rollout_id, rollout.status.attempt_id, name)
        try:
            job = await self._retrying(self._jobs.get, name)
            if job is None:
                reason = (
                    f"Job {self._namespace}/{name} not found after {cause or 'a controller restart'} "
                    "(deleted, cleaned up after it finished, or never created)"
                )
                return Outcome.failure(VANISHED, reason)
            attempt = ((job.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION)
            if attempt != rollout.status.attempt_id:
                expected = rollout.status.attempt_id
                reason = f"Job {self._namespace}/{name} belongs to attempt {attempt!r}, not {expected!r}"
                return Outcome.failure(VANISHED, reason)
            log.info("rollout %s: adopted Job %s/%s%s", rollout.rollout_id, self._namespace, name,
                     f" ({cause})" if cause else "")  # fmt: skip
            tracked.created_at = time.monotonic()
            self._observe(tracked, job)
            return await asyncio.shield(tracked.future)
        finally:
            self._tracked.pop(name, None)

    # -- creation --------------------------------------------------------------------------------------------

    def _track(self, rollout_id: str, attempt_id: str, name: str) -> _Tracked:
        assert self._loop is not None, "start() first"
        tracked = _Tracked(rollout_id, attempt_id, name, self._loop.create_future())
        self._tracked[name] = tracked
        return tracked

    async def _create(self, plan: LaunchPlan, name: str) -> Outcome | dict[str, Any]:
        """The Job once it exists (created, or adopted after 409), or a failure outcome when it cannot."""
        where = f"{self._namespace}/{name}"
        deadline = time.monotonic() + plan.timeout_s
        delay = 0.2
        while True:
            try:
                job = await asyncio.to_thread(self._jobs.create, plan.detail)
                log.info("rollout %s: created Job %s (attempt %s)", plan.rollout_id, where, plan.attempt_id)
                return job
            except KubeError as err:
                if err.status == 409:
                    existing = await asyncio.to_thread(self._jobs.get, name)
                    if existing is not None:
                        annotations = (existing.get("metadata") or {}).get("annotations") or {}
                        if annotations.get(ATTEMPT_ANNOTATION) == plan.attempt_id:
                            log.info("rollout %s: Job %s already exists; adopted", plan.rollout_id, where)
                            return existing
                        reason = (
                            f"Job {where} already exists for attempt {annotations.get(ATTEMPT_ANNOTATION)!r}, "
                            f"not {plan.attempt_id!r}"
                        )
                        return Outcome.failure(JOB_REJECTED, reason)
                elif not err.transient:
                    log.warning("rollout %s: Job %s rejected: %s", plan.rollout_id, where, err)
                    return Outcome.failure(JOB_REJECTED, f"Job {where} rejected by the API server: {err}")
                if time.monotonic() + delay > deadline:
                    return Outcome.failure(SPAWN_ERROR, f"could not create Job {where}: {err}")
                log.warning("rollout %s: creating Job %s failed (%s); retrying", plan.rollout_id, where, err)
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._max_create_backoff_s)

    async def _retrying(self, call: Callable[..., Any], *args: Any) -> Any:
        delay = 0.2
        while True:
            try:
                return await asyncio.to_thread(call, *args)
            except KubeError as err:
                if not err.transient or self._stop.is_set():
                    raise
                log.warning("Kubernetes API call failed (%s); retrying in %.1fs", err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_create_backoff_s)

    # -- following Jobs (on the event loop) ------------------------------------------------------------------

    def _observe(self, tracked: _Tracked, job: dict[str, Any]) -> None:
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        if annotations.get(ATTEMPT_ANNOTATION) not in (None, tracked.attempt_id):
            return
        outcome = job_outcome(job)
        if outcome is not None:
            self._settle(tracked, outcome)

    def _settle(self, tracked: _Tracked, outcome: Outcome) -> None:
        if tracked.settling or tracked.future.done():
            return
        tracked.settling = True
        if outcome.kind == JOB_FAILED:
            finishing = self._settle_with_detail(tracked, outcome)
        elif outcome.succeeded:
            finishing = self._settle_with_returned(tracked, outcome)
        else:
            tracked.future.set_result(outcome)
            return
        task = asyncio.get_running_loop().create_task(finishing)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle_with_returned(self, tracked: _Tracked, outcome: Outcome) -> None:
        """Adds the reward the agent left as its termination message (run() returned it), when there is one.

        One pod list per succeeded Job; when it fails the attempt still succeeds, without a returned reward."""
        try:
            pods = await asyncio.to_thread(self._jobs.pods, tracked.name)
            if (value := returned_in_pods(pods)) is not None:
                outcome = Outcome(True, outcome.reason, outcome.kind, returned_reward=value)
        except (KubeError, KeyError, TypeError) as err:
            log.warning(
                "rollout %s: could not read the pods of Job %s for a returned reward: %s",
                tracked.rollout_id, tracked.name, err,
            )  # fmt: skip
        if not tracked.future.done():
            tracked.future.set_result(outcome)

    async def _settle_with_detail(self, tracked: _Tracked, outcome: Outcome) -> None:
        """Adds how the pod's containers ended and the last log lines to a Job failure (best effort)."""
        detail, tail = "", ""
        try:
            pods = await asyncio.to_thread(self._jobs.pods, tracked.name)
            detail = describe_pods(pods)
            if lost := lost_pod(pods):
                outcome = as_lost(outcome, lost)
            for pod in pods:
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    tail = await asyncio.to_thread(
                        self._jobs.log_tail, pod["metadata"]["name"], status.get("name", ""), 20
                    )
                    break
                break
        except (KubeError, KeyError, TypeError) as err:
            log.info("rollout %s: no pod details for Job %s: %s", tracked.rollout_id, tracked.name, err)
        if not tracked.future.done():
            tracked.future.set_result(with_detail(outcome, detail, tail))

    def _on_event(self, kind: str, job: dict[str, Any]) -> None:
        tracked = self._tracked.get((job.get("metadata") or {}).get("name", ""))
        if tracked is None:
            return
        if kind == "DELETED":
            annotations = (job.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ATTEMPT_ANNOTATION) not in (None, tracked.attempt_id):
                return
            self._settle(tracked, job_outcome(job) or vanished(self._namespace, tracked.name))
        elif kind in ("ADDED", "MODIFIED"):
            self._observe(tracked, job)

    def _on_list(self, jobs: list[dict[str, Any]], started_at: float) -> None:
        """A full list: settle what finished, and what vanished (only Jobs known to exist before the list began)."""
        by_name = {(job.get("metadata") or {}).get("name"): job for job in jobs}
        for name, tracked in list(self._tracked.items()):
            job = by_name.get(name)
            if job is not None:
                self._observe(tracked, job)
            elif tracked.created_at is not None and tracked.created_at < started_at:
                self._settle(tracked, vanished(self._namespace, name))

    async def _reconcile_loop(self) -> None:
        suspects: set[str] = set()
        while True:
            await asyncio.sleep(self._reconcile_interval_s)
            started = time.monotonic()
            try:
                jobs, _ = await asyncio.to_thread(self._jobs.list, MANAGED_SELECTOR)
            except KubeError as err:
                log.warning("reconcile: listing Jobs failed: %s", err)
                continue
            self._on_list(jobs, started)
            suspects = await self._collect_orphans(jobs, suspects)

    async def _collect_orphans(self, jobs: list[dict[str, Any]], suspects: set[str]) -> set[str]:
        """Deletes this controller's unfinished Jobs that no rollout waits for (seen so on two re-lists in a row).

        They are left over when a rollout was reported failed while its Job was being created (shutdown,
        create retries that timed out) or when the ledger failed a rollout behind the controller's back.
        """
        seen: set[str] = set()
        for job in jobs:
            metadata = job.get("metadata") or {}
            name = metadata.get("name", "")
            annotations = metadata.get("annotations") or {}
            if (
                annotations.get(CONTROLLER_ANNOTATION) != self._controller_id
                or name in self._tracked
                or job_outcome(job) is not None
            ):
                continue
            if name not in suspects:
                seen.add(name)
                continue
            rollout_id = annotations.get(ROLLOUT_ANNOTATION, "?")
            log.warning(
                "rollout %s: deleting orphaned Job %s/%s: nothing waits for it", rollout_id, self._namespace, name
            )
            try:
                await asyncio.to_thread(self._jobs.delete, name)
            except KubeError as err:
                log.warning("rollout %s: deleting Job %s failed: %s", rollout_id, name, err)
        return seen

    # -- the watch thread ------------------------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the controller is gone
            return False
        return True

    def _watch_loop(self) -> None:
        resource_version = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not resource_version:
                    started = time.monotonic()
                    jobs, resource_version = self._jobs.list(MANAGED_SELECTOR)
                    if not self._post(self._on_list, jobs, started):
                        return
                for kind, job in self._jobs.watch(MANAGED_SELECTOR, resource_version, self._watch_timeout_s):
                    resource_version = (job.get("metadata") or {}).get("resourceVersion") or resource_version
                    if kind != "BOOKMARK" and not self._post(self._on_event, kind, job):
                        return
                failures = 0
            except ResourceExpired:
                log.info("Job watch: resourceVersion %s expired; re-listing", resource_version)
                resource_version = ""
            except KubeError as err:
                failures += 1
                delay = min(0.2 * 2**failures, 10.0)
                if not self._stop.is_set():
                    log.warning("Job watch failed (%s); retrying in %.1fs", err, delay)
                self._stop.wait(random.uniform(delay / 2, delay))
            except Exception:
                log.exception("Job watch crashed; restarting it")
                resource_version = ""
                self._stop.wait(1.0)
