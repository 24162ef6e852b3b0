"""A small Kubernetes API server for the batch/v1 Jobs endpoints the controller uses, on loopback.

It speaks the real REST protocol, so the official client talks to it through a generated kubeconfig:
bearer-token auth, create (201, 409 AlreadyExists, 400/422 with Status bodies), get, list with label
selectors, delete, and watch (chunked JSON lines, resourceVersion resume, ERROR 410 Expired once history
is compacted, timeoutSeconds), and the discovery documents a client reads first (`/version`, `/api`, `/apis` and
the group versions' resource lists, open to any authenticated caller as the `system:discovery` role makes them in a
real cluster). Pods and pod logs exist for finished Jobs so that failure details (and a
container's termination message) can be read. Tests drive the cluster side with complete_job / fail_job /
delete_job / expire_watches; Jobs whose activeDeadlineSeconds passes fail with DeadlineExceeded as in a real
cluster.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_JOBS = re.compile(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?")
_PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods")
_POD_LOG = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log")


# The server version the stand-in reports (`GET /version`), and the resources its discovery documents list: the ones
# it serves, with the verbs it serves them with.
SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T07:28:49Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_RESOURCES = {
    "v1": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    ],
    "batch/v1": [
        {
            "name": "jobs",
            "singularName": "job",
            "namespaced": True,
            "kind": "Job",
            "verbs": ["create", "delete", "get", "list", "watch"],
            "categories": ["all"],
        },
    ],
}


def discovery_document(path: str) -> dict[str, Any] | None:
    """What a Kubernetes API server answers to a discovery GET of `path`, or None for a path that is not one. The
    API server serves each of them with a trailing slash too (kr8s asks for `/version/`, `/api/` and `/apis/`)."""
    path = path.removesuffix("/") if path != "/" else path
    if path == "/version":
        return dict(SERVER_VERSION)
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    group_versions = [v for v in _RESOURCES if "/" in v]
    if path == "/apis":
        groups = []
        for group_version in group_versions:
            entry = {"groupVersion": group_version, "version": group_version.split("/")[1]}
            groups.append({"name": group_version.split("/")[0], "versions": [entry], "preferredVersion": entry})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    group_version = path.removeprefix("/apis/") if path.startswith("/apis/") else path.removeprefix("/api/")
    if path.startswith(("/api/", "/apis/")) and group_version in _RESOURCES:
        resources = [dict(r) for r in _RESOURCES[group_version]]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}
    return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def parse_selector(selector: str) -> Callable[[dict[str, str]], bool]:
    """Equality-based label selectors: k=v, k==v, k!=v, k, !k (comma-separated, all must hold)."""
    terms: list[tuple[str, str, str]] = []
    for raw in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif raw.startswith("!"):
            terms.append(("!", raw[1:].strip(), ""))
        else:
            terms.append(("exists", raw, ""))

    def holds(labels: dict[str, str], op: str, key: str, value: str) -> bool:
        if op == "!=":
            return labels.get(key) != value
        if op == "=":
            return labels.get(key) == value
        return (key in labels) == (op == "exists")

    return lambda labels: all(holds(labels, *term) for term in terms)


def _label_errors(labels: Any, field: str) -> list[str]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [f"{field}: Invalid value: must be a map"]
    errors = []
    for key, value in labels.items():
        name = str(key).rsplit("/", 1)[-1]
        if not _LABEL_NAME.fullmatch(name) or len(name) > 63:
            errors.append(f"{field}: Invalid value: {key!r}: name part must be a valid label name")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            errors.append(f"{field}: Invalid value: {value!r}: a valid label must be 63 characters or less")
    return errors


class K8sStandin:
    """The fake cluster: state, history and the HTTP server in a background thread."""

    def __init__(
        self, token: str = "standin-token", tick_s: float = 0.05, rbac_rules: list[dict[str, Any]] | None = None
    ) -> None:
        self.token = token
        # Role rules the token is bound to (None: everything allowed); a request they do not allow gets 403.
        self.rbac_rules = rbac_rules
        self.forbidden: list[str] = []
        self._cond = threading.Condition()
        self._rv = 100
        self._jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._logs: dict[tuple[str, str], str] = {}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, namespace, type, object)
        self._compacted_rv = 0
        self._watch_epoch = 0
        self._closing = False
        self._tick_s = tick_s
        self.create_calls = 0
        self.created: list[str] = []
        self.watch_requests: list[str] = []  # resourceVersion of each watch request
        self.list_requests = 0
        self.discovery_requests: list[str] = []  # the discovery paths asked for, in order
        self.fail_next_creates: list[int] = []  # HTTP statuses to answer the next creates with
        self.lose_next_create_responses = 0  # creates that store the Job but answer 504 (a lost response)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> K8sStandin:
        for target in (self._server.serve_forever, self._deadline_loop):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> K8sStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "agl", "user": {"token": self.token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "agl", "namespace": namespace}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config))
        return path

    # -- state (call with the lock held) ---------------------------------------------------------------------

    def _record(self, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, namespace, kind, copy.deepcopy(obj)))
        self._cond.notify_all()

    def _finish(
        self,
        namespace: str,
        name: str,
        ok: bool,
        reason: str,
        message: str,
        exit_code: int,
        log: str,
        pod_reason: str = "",
        termination_message: str = "",
    ) -> None:
        job = self._jobs[(namespace, name)]
        status = job["status"]
        if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions", [])):
            return
        now = _now()
        first, final = ("SuccessCriteriaMet", "Complete") if ok else ("FailureTarget", "Failed")
        conditions = []
        for kind in (first, final):
            condition = {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
            if not ok:
                condition |= {"reason": reason, "message": message}
            conditions.append(condition)
        status["conditions"] = conditions
        status["active"] = 0
        status["succeeded" if ok else "failed"] = 1
        if ok:
            status["completionTime"] = now
        if reason != "DeadlineExceeded":
            self._add_pod(namespace, job, ok, exit_code, log, pod_reason, termination_message)
        self._record(namespace, "MODIFIED", job)

    def _add_pod(
        self,
        namespace: str,
        job: dict[str, Any],
        ok: bool,
        exit_code: int,
        log: str,
        pod_reason: str = "",
        termination_message: str = "",
    ) -> None:
        job_name = job["metadata"]["name"]
        pod_name = f"{job_name}-{uuid.uuid4().hex[:5]}"
        containers = job["spec"]["template"]["spec"]["containers"]
        terminated = {"exitCode": exit_code, "reason": "Completed" if ok else "Error", "finishedAt": _now()}
        statuses = [{"name": c["name"], "state": {"terminated": dict(terminated)}} for c in containers]
        if termination_message:  # what the first container wrote to its terminationMessagePath, as the kubelet says
            statuses[0]["state"]["terminated"]["message"] = termination_message
        self._pods[(namespace, pod_name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name},
            },
            "status": {
                "phase": "Succeeded" if ok else "Failed",
                "containerStatuses": statuses,
            },
        }
        if pod_reason:  # taken away by the kubelet or the scheduler, as an evicted pod reports it
            status = self._pods[(namespace, pod_name)]["status"]
            message = f"The pod was {pod_reason.lower()}: the node was low on memory."
            status |= {"reason": pod_reason, "message": message}
        self._logs[(namespace, pod_name)] = log

    def _deadline_loop(self) -> None:
        while True:
            with self._cond:
                if self._closing:
                    return
                now = time.monotonic()
                for (namespace, name), job in list(self._jobs.items()):
                    deadline = job["spec"].get("activeDeadlineSeconds")
                    started = job["_started"]
                    if deadline and now - started > deadline:
                        message = "Job was active longer than specified deadline"
                        self._finish(namespace, name, False, "DeadlineExceeded", message, 0, "")
                self._cond.wait(self._tick_s)

    # -- test hooks ------------------------------------------------------------------------------------------

    def jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [
                self._public(job) for (ns, _), job in sorted(self._jobs.items()) if namespace is None or ns == namespace
            ]

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._cond:
            job = self._jobs.get((namespace, name))
            return self._public(job) if job else None

    def complete_job(self, namespace: str, name: str, log: str = "", termination_message: str = "") -> None:
        with self._cond:
            self._finish(namespace, name, True, "", "", 0, log, termination_message=termination_message)

    def fail_job(
        self,
        namespace: str,
        name: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
        exit_code: int = 1,
        log: str = "",
    ) -> None:
        with self._cond:
            self._finish(namespace, name, False, reason, message, exit_code, log)

    def evict_job(self, namespace: str, name: str) -> None:
        """The Job's pod is evicted (its container killed, exit 137): the Job fails as with backoffLimit 0."""
        with self._cond:
            message = "Job has reached the specified backoff limit"
            self._finish(namespace, name, False, "BackoffLimitExceeded", message, 137, "", pod_reason="Evicted")

    def delete_job(self, namespace: str, name: str) -> bool:
        with self._cond:
            job = self._jobs.pop((namespace, name), None)
            if job is None:
                return False
            self._record(namespace, "DELETED", job)
            return True

    def expire_watches(self) -> None:
        """Forgets all history and ends every open watch: clients resuming from their resourceVersion get 410."""
        with self._cond:
            self._rv += 1  # as if other objects had changed since: every client's resourceVersion is now too old
            self._compacted_rv = self._rv
            self._history.clear()
            self._watch_epoch += 1
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached on the Kubernetes stand-in")
            time.sleep(0.02)

    @staticmethod
    def _public(job: dict[str, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in job.items() if not k.startswith("_")}

    # -- HTTP ------------------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                standin._dispatch(self, "GET")

            def do_POST(self) -> None:
                standin._dispatch(self, "POST")

            def do_DELETE(self) -> None:
                standin._dispatch(self, "DELETE")

        return Handler

    def _send(self, handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            self._send(handler, 401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        document = discovery_document(parts.path) if method == "GET" else None
        if document is not None:  # open to every authenticated caller, whatever its Role
            self.discovery_requests.append(parts.path.removesuffix("/"))
            self._send(handler, 200, document)
            return
        if not self._allowed(method, parts.path, query):
            self.forbidden.append(f"{method} {parts.path}")
            message = f"{method} {parts.path} is forbidden by the controller's Role"
            self._send(handler, 403, status_body(403, "Forbidden", message))
            return
        if match := _JOBS.fullmatch(parts.path):
            namespace, name = match.groups()
            if method == "POST" and name is None:
                self._create(handler, namespace, raw)
            elif method == "GET" and name is None and query.get("watch") in ("true", "1"):
                self._watch(handler, namespace, query)
            elif method == "GET" and name is None:
                self._list(handler, namespace, query)
            elif method == "GET":
                self._get(handler, namespace, name)
            elif method == "DELETE" and name is not None:
                self._delete(handler, namespace, name)
            else:
                self._send(handler, 405, status_body(405, "MethodNotAllowed", f"{method} not allowed"))
        elif (match := _POD_LOG.fullmatch(parts.path)) and method == "GET":
            self._pod_log(handler, match.group(1), match.group(2), query)
        elif (match := _PODS.fullmatch(parts.path)) and method == "GET":
            self._list_pods(handler, match.group(1), query)
        else:
            self._send(handler, 404, status_body(404, "NotFound", f"the server could not find {parts.path}"))

    def _allowed(self, method: str, path: str, query: dict[str, str]) -> bool:
        """RBAC as the API server checks it: (API group, resource, verb) against the Role's rules."""
        if self.rbac_rules is None:
            return True
        if match := _JOBS.fullmatch(path):
            group, resource, named = "batch", "jobs", match.group(2) is not None
        elif _POD_LOG.fullmatch(path):
            group, resource, named = "", "pods/log", True
        elif _PODS.fullmatch(path):
            group, resource, named = "", "pods", False
        else:
            return False
        if method == "GET":
            verb = "get" if named else ("watch" if query.get("watch") in ("true", "1") else "list")
        else:
            verb = {"POST": "create", "DELETE": "delete"}.get(method, method.lower())
        for rule in self.rbac_rules:
            groups, resources, verbs = rule.get("apiGroups", []), rule.get("resources", []), rule.get("verbs", [])
            if group in groups and resource in resources and verb in verbs:
                return True
        return False

    def _validate(self, namespace: str, job: Any) -> tuple[int, str, list[str]]:
        if not isinstance(job, dict):
            return 400, "BadRequest", ["body must be a JSON object"]
        if job.get("apiVersion") != "batch/v1" or job.get("kind") != "Job":
            return 400, "BadRequest", [f"expected batch/v1 Job, got {job.get('apiVersion')} {job.get('kind')}"]
        metadata = job.get("metadata") or {}
        if metadata.get("namespace") not in (None, namespace):
            return 400, "BadRequest", ["the namespace of the provided object does not match the namespace sent"]
        errors = []
        name = metadata.get("name") or ""
        if not _DNS_LABEL.fullmatch(name) or len(name) > 63:
            errors.append(f"metadata.name: Invalid value: {name!r}: must be a DNS-1123 label of at most 63 chars")
        errors += _label_errors(metadata.get("labels"), "metadata.labels")
        spec = job.get("spec") or {}
        template = spec.get("template") or {}
        errors += _label_errors((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        pod_spec = template.get("spec") or {}
        if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
            errors.append(f'spec.template.spec.restartPolicy: Unsupported value: "{pod_spec.get("restartPolicy")}"')
        containers = pod_spec.get("containers") or []
        if not containers:
            errors.append("spec.template.spec.containers: Required value")
        for i, container in enumerate(containers):
            if not _DNS_LABEL.fullmatch(str(container.get("name") or "")):
                errors.append(f"spec.template.spec.containers[{i}].name: Invalid value")
            if not container.get("image"):
                errors.append(f"spec.template.spec.containers[{i}].image: Required value")
        return (422, "Invalid", errors) if errors else (0, "", [])

    def _create(self, handler: BaseHTTPRequestHandler, namespace: str, raw: bytes) -> None:
        try:
            job = json.loads(raw)
        except ValueError as err:
            self._send(handler, 400, status_body(400, "BadRequest", f"invalid JSON: {err}"))
            return
        with self._cond:
            self.create_calls += 1
            if self.fail_next_creates:
                code = self.fail_next_creates.pop(0)
                self._send(handler, code, status_body(code, "InternalError", "injected failure"))
                return
            code, reason, errors = self._validate(namespace, job)
            if code:
                name = (job.get("metadata") or {}).get("name") if isinstance(job, dict) else None
                message = f'Job.batch "{name}" is invalid: ' + "; ".join(errors)
                self._send(handler, code, status_body(code, reason, message, {"name": name, "kind": "jobs"}))
                return
            name = job["metadata"]["name"]
            if (namespace, name) in self._jobs:
                message = f'jobs.batch "{name}" already exists'
                details = {"name": name, "group": "batch", "kind": "jobs"}
                self._send(handler, 409, status_body(409, "AlreadyExists", message, details))
                return
            uid = str(uuid.uuid4())
            metadata = job["metadata"]
            metadata |= {"namespace": namespace, "uid": uid, "creationTimestamp": _now(), "generation": 1}
            spec = job["spec"]
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            pod_labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            pod_labels |= {"controller-uid": uid, "job-name": name, "batch.kubernetes.io/job-name": name}
            job["status"] = {"startTime": _now(), "active": 1}
            job["_started"] = time.monotonic()
            self._jobs[(namespace, name)] = job
            self.created.append(name)
            self._record(namespace, "ADDED", job)
            if self.lose_next_create_responses > 0:
                self.lose_next_create_responses -= 1
                message = "Timeout: request did not complete within requested timeout"
                self._send(handler, 504, status_body(504, "Timeout", message))
                return
            self._send(handler, 201, self._public(job))

    def _get(self, handler: BaseHTTPRequestHandler, namespace: str, name: str) -> None:
        with self._cond:
            job = self._jobs.get((namespace, name))
            body = self._public(job) if job else None
        if body is None:
            self._send(handler, 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'))
        else:
            self._send(handler, 200, body)

    def _list(self, handler: BaseHTTPRequestHandler, namespace: str, query: dict[str, str]) -> None:
        matches = parse_selector(query.get("labelSelector", ""))
        with self._cond:
            self.list_requests += 1
            items = [
                self._public(job)
                for (ns, _), job in sorted(self._jobs.items())
                if ns == namespace and matches(job["metadata"].get("labels") or {})
            ]
            rv = self._rv
        body = {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {"resourceVersion": str(rv)}, "items": items}
        self._send(handler, 200, body)

    def _delete(self, handler: BaseHTTPRequestHandler, namespace: str, name: str) -> None:
        with self._cond:
            job = self._jobs.pop((namespace, name), None)
            if job is not None:
                self._record(namespace, "DELETED", job)
                body = self._public(job)
        if job is None:
            self._send(handler, 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'))
        else:
            self._send(handler, 200, body)

    def _list_pods(self, handler: BaseHTTPRequestHandler, namespace: str, query: dict[str, str]) -> None:
        matches = parse_selector(query.get("labelSelector", ""))
        with self._cond:
            items = [
                copy.deepcopy(pod)
                for (ns, _), pod in sorted(self._pods.items())
                if ns == namespace and matches(pod["metadata"]["labels"])
            ]
            rv = self._rv
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}, "items": items}
        self._send(handler, 200, body)

    def _pod_log(self, handler: BaseHTTPRequestHandler, namespace: str, pod: str, query: dict[str, str]) -> None:
        with self._cond:
            text = self._logs.get((namespace, pod))
        if text is None:
            self._send(handler, 404, status_body(404, "NotFound", f'pods "{pod}" not found'))
            return
        lines = text.splitlines(keepends=True)
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]) :]
        self._send(handler, 200, "".join(lines))

    def _watch(self, handler: BaseHTTPRequestHandler, namespace: str, query: dict[str, str]) -> None:
        matches = parse_selector(query.get("labelSelector", ""))
        timeout_s = float(query.get("timeoutSeconds") or 1800)
        since = query.get("resourceVersion") or "0"
        self.watch_requests.append(since)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def chunk(event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        deadline = time.monotonic() + timeout_s
        try:
            with self._cond:
                epoch = self._watch_epoch
                if since == "0":
                    initial = [
                        self._public(job)
                        for (ns, _), job in sorted(self._jobs.items())
                        if ns == namespace and matches(job["metadata"].get("labels") or {})
                    ]
                    position = self._rv
                else:
                    initial = []
                    position = int(since)
                    if position < self._compacted_rv:
                        message = f"too old resource version: {position} ({self._compacted_rv})"
                        chunk({"type": "ERROR", "object": status_body(410, "Expired", message)})
                        return
            for job in initial:
                chunk({"type": "ADDED", "object": job})
            while True:
                with self._cond:
                    pending = [
                        (rv, kind, obj)
                        for rv, ns, kind, obj in self._history
                        if rv > position and ns == namespace and matches(obj["metadata"].get("labels") or {})
                    ]
                    if not pending:
                        if self._closing or self._watch_epoch != epoch or time.monotonic() > deadline:
                            return
                        self._cond.wait(min(0.5, max(deadline - time.monotonic(), 0.01)))
                        continue
                    position = pending[-1][0]
                for _, kind, obj in pending:
                    chunk({"type": kind, "object": self._public(obj)})
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            try:
                handler.wfile.write(b"0\r\n\r\n")
                handler.wfile.flush()
            except OSError:
                pass
