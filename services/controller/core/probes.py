"""The controller's one listener: /metrics (Prometheus), /healthz (liveness), /readyz (readiness); 404 elsewhere.

An HTTP server beside /metrics rather than a gRPC health service: the controller serves nothing else, the port is
already there, and kubelet's httpGet probe, curl and the compose healthcheck all speak it. It runs on threads of its
own (services/ops_http.py, which also bounds its connections and their deadlines), so a busy event loop never fails a
liveness probe. /healthz answers 200 while the process lives; /readyz answers 200 or 503 with a JSON body saying why
(see readiness.py).
"""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from services.ops_http import Answer, Handler, OpsServer, Request, metrics_answer

from .readiness import Readiness

_JSON = "application/json"
_NOT_FOUND = b"not found: the controller serves /metrics, /healthz and /readyz\n"


def probe_handler(registry: CollectorRegistry, readiness: Readiness) -> Handler:
    def handle(request: Request) -> Answer:
        if request.path == "/metrics":
            return metrics_answer(registry, request)
        if request.path == "/healthz":
            return Answer(200, b"ok\n")
        if request.path == "/readyz":
            body = readiness.describe()
            return Answer(200 if body["ready"] else 503, json.dumps(body).encode(), _JSON)
        return Answer(404, _NOT_FOUND)

    return handle


def start_probe_server(host: str, port: int, registry: CollectorRegistry, readiness: Readiness) -> OpsServer:
    return OpsServer(host, port, probe_handler(registry, readiness), name="controller-probes").start()
