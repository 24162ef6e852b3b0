"""Pure mapping from a Job (and its pods) as the API server reports them to the attempt's outcome."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..core.outcome import EVICTED, JOB_FAILED, VANISHED, Outcome, parse_returned, timed_out

_MAX_DETAIL = 1500


def job_outcome(job: Mapping[str, Any]) -> Outcome | None:
    """Succeeded on Complete, failed on Failed (DeadlineExceeded -> timeout), None while it still runs."""
    name = (job.get("metadata") or {}).get("name", "?")
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return Outcome.success()
        if condition.get("type") == "Failed":
            reason = condition.get("reason") or "Failed"
            message = condition.get("message") or ""
            if reason == "DeadlineExceeded":
                deadline = (job.get("spec") or {}).get("activeDeadlineSeconds") or 0
                return timed_out(float(deadline), f"(Job {name}: {message or reason})")
            text = f"Job {name} failed: {reason}"
            return Outcome.failure(JOB_FAILED, f"{text}: {message}" if message else text)
    return None


def vanished(namespace: str, name: str) -> Outcome:
    return Outcome.failure(VANISHED, f"Job {namespace}/{name} vanished before it finished")


# Pod status reasons that mean the node or the cluster took the pod away, not that the agent failed.
_LOST_POD_REASONS = frozenset({"Evicted", "Preempted", "Preempting", "NodeLost", "Shutdown", "Terminated"})


def lost_pod(pods: Sequence[Mapping[str, Any]]) -> str:
    """The reason of a pod the cluster took away (evicted, preempted, node lost), or "" when none was."""
    for pod in pods:
        reason = (pod.get("status") or {}).get("reason") or ""
        if reason in _LOST_POD_REASONS:
            return reason
    return ""


def as_lost(outcome: Outcome, reason: str) -> Outcome:
    """A Job failure whose pod was taken away: an infrastructure loss (retryable), not the agent's answer."""
    return Outcome(False, f"{outcome.reason} (pod {reason})", EVICTED)


def describe_pods(pods: Sequence[Mapping[str, Any]]) -> str:
    """How the Job's containers ended, e.g. "container agent exited with code 3 (Error)"."""
    parts: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        for container, terminated in _terminated_containers(status):
            text = f"container {container.get('name', '?')} exited with code {terminated.get('exitCode', '?')}"
            if terminated.get("reason"):
                text += f" ({terminated['reason']})"
            if terminated.get("message"):
                text += f": {terminated['message']}"
            parts.append(text)
        if not parts and status.get("reason"):
            parts.append(f"pod {(pod.get('metadata') or {}).get('name', '?')}: {status['reason']}")
    return "; ".join(parts)


def returned_in_pods(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """The reward a succeeded pod's container left as its termination message (`{"value": x}`, written by
    agent_runner's `--result-file /dev/termination-log`), or None. Pods that did not succeed are passed over:
    with backoffLimit 0 there is one pod, but a pod the Job replaced (evicted, say) must not lend its value."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Succeeded":
            continue
        for _, terminated in _terminated_containers(status):
            message = terminated.get("message")
            if message and (value := parse_returned(message)) is not None:
                return value
    return None


def _terminated_containers(pod_status: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(container status, its `state.terminated`) for each container of the pod that has ended."""
    for container in pod_status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            yield container, terminated


def with_detail(outcome: Outcome, detail: str, log_tail: str = "") -> Outcome:
    """The outcome with pod details and the last log lines appended (bounded length)."""
    reason = outcome.reason
    if detail:
        reason += f"; {detail}"
    if log_tail.strip():
        reason += f"; log tail: {log_tail.strip()[-_MAX_DETAIL:]}"
    return Outcome(outcome.succeeded, reason[: _MAX_DETAIL * 2], outcome.kind)
