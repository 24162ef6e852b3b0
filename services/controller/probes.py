"""The controller's one listener: /metrics (Prometheus), /healthz (liveness), /readyz (readiness); 404 elsewhere.

An HTTP server beside /metrics rather than a gRPC health service: the controller serves nothing else, the port is
already there, and kubelet's httpGet probe, curl and the compose healthcheck all speak it. It runs in a thread of its
own, so a busy event loop never fails a liveness probe. /healthz answers 200 while the process lives; /readyz answers
200 or 503 with a JSON body saying why (see readiness.py).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from .readiness import Readiness

# wsgiref adds Content-Length to the header list it is given: each response gets a fresh list.
_JSON = ("Content-Type", "application/json")
_TEXT = ("Content-Type", "text/plain; charset=utf-8")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
        return


def probe_app(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [_TEXT])
            return [b"ok\n"]
        if path == "/readyz":
            body = readiness.describe()
            start_response("200 OK" if body["ready"] else "503 Service Unavailable", [_JSON])
            return [json.dumps(body).encode()]
        start_response("404 Not Found", [_TEXT])
        return [b"not found: the controller serves /metrics, /healthz and /readyz\n"]

    return app


def start_probe_server(
    host: str, port: int, registry: CollectorRegistry, readiness: Readiness
) -> tuple[WSGIServer, threading.Thread]:
    server_class = _IPv6Server if ":" in host else _Server
    server = make_server(
        host, port, probe_app(registry, readiness), server_class=server_class, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="controller-probes", daemon=True)
    thread.start()
    return server, thread
