"""Thin blocking wrapper around the official kubernetes client for the calls the controller makes.

Objects travel as plain dicts (the API server's JSON); errors become KubeError with the HTTP status, so the
runner decides retry-or-fail in one place. Call these from asyncio through asyncio.to_thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT = (5.0, 30.0)


class KubeError(Exception):
    """A failed API call: `status` is the HTTP status, None for transport errors."""

    def __init__(self, status: int | None, reason: str, message: str = "") -> None:
        head = f"{status or 'transport'} {reason}"
        super().__init__(f"{head}: {message}" if message else head)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: transport errors, 5xx, 408 and 429."""
        return self.status is None or self.status >= 500 or self.status in (408, 429)


class ResourceExpired(KubeError):
    """410 Gone: the watch's resourceVersion is no longer kept; re-list."""


def _from_api_exception(err: ApiException) -> KubeError:
    reason, message = err.reason or "", ""
    try:
        body = json.loads(err.body or "{}")
        reason = body.get("reason") or reason
        message = body.get("message") or ""
    except (ValueError, AttributeError):
        message = str(err.body or "")[:500]
    cls = ResourceExpired if err.status == 410 else KubeError
    return cls(err.status, reason, message)


def load_api_client(kubeconfig: str = "", context: str = "") -> kubernetes.client.ApiClient:
    """In-cluster config when no kubeconfig is named and we run in a pod; the kubeconfig otherwise."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(
            config_file=kubeconfig, context=context or None, client_configuration=configuration
        )
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(context=context or None, client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


class KubeJobs:
    """batch/v1 Jobs (and their pods' status and logs) of one namespace."""

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self._batch = kubernetes.client.BatchV1Api(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._watch: kubernetes.watch.Watch | None = None

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = method(*args, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT, **kwargs)
            data = response.data
        except ApiException as err:
            raise _from_api_exception(err) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(None, type(err).__name__, str(err)) from err
        return json.loads(data) if data else {}

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._batch.create_namespaced_job, self.namespace, manifest)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._batch.read_namespaced_job, name, self.namespace)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def list(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        """The matching Jobs and the list's resourceVersion (where a watch continues)."""
        body = self._call(self._batch.list_namespaced_job, self.namespace, label_selector=label_selector)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def delete(self, name: str) -> bool:
        try:
            self._call(self._batch.delete_namespaced_job, name, self.namespace, propagation_policy="Background")
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True

    def watch(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, job) changes after resource_version until the server ends the watch after timeout_s."""
        watch = kubernetes.watch.Watch(return_type="object")
        self._watch = watch
        stream = watch.stream(
            self._batch.list_namespaced_job,
            self.namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _request_timeout=(_REQUEST_TIMEOUT[0], timeout_s + 15),
        )
        try:
            for event in stream:
                yield event["type"], event["raw_object"]
        except ApiException as err:
            raise _from_api_exception(err) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(None, type(err).__name__, str(err)) from err
        finally:
            self._watch = None

    def stop_watch(self) -> None:
        """Unblocks a watch running in another thread."""
        if self._watch is not None:
            self._watch.stop()

    def pods(self, job_name: str) -> list[dict[str, Any]]:
        body = self._call(self._core.list_namespaced_pod, self.namespace, label_selector=f"job-name={job_name}")
        return list(body.get("items") or [])

    def log_tail(self, pod_name: str, container: str, lines: int = 20) -> str:
        try:
            response = self._core.read_namespaced_pod_log(
                pod_name,
                self.namespace,
                container=container,
                tail_lines=lines,
                limit_bytes=4096,
                _preload_content=False,
                _request_timeout=_REQUEST_TIMEOUT,
            )
            return response.data.decode(errors="replace")
        except ApiException as err:
            raise _from_api_exception(err) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(None, type(err).__name__, str(err)) from err
