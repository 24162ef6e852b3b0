"""Runs the services of deploy/docker-compose.yaml as local processes, the way compose runs them.

Each service gets the command its container runs (the image's ENTRYPOINT and CMD, or the compose
`entrypoint`/`command`), the environment its container gets (the image's ENV, then the compose
`environment`, interpolated like compose does), the same start order (`depends_on`, waiting for the
service to be healthy) and the same health check (the image's HEALTHCHECK or the compose one). Only what
a host process cannot share with a container is changed, mechanically:

- `agl-*` console scripts run as `python -m <module>` (the modules AGL's installed entry points name), `python` is
  this interpreter, and the image's PYTHONPATH (where it copied the code) is the checkout this runs from (nothing
  for an installed AGL, whose interpreter finds its own package);
- addresses `<service>:<port>` become `127.0.0.1:<free port>`, bind hosts `0.0.0.0` become `127.0.0.1`, and
  a service's own `*_PORT` variables take its free ports;
- paths under a volume's mount point move into a folder of the given data directory;
- `overrides` (per service: variable -> value) replace variables the compose file sets, and nothing else.

`agl train`/`try`/`eval`, `make demo` (tools/demo.py) and the end-to-end tests start the stack through this
module, so they run what the compose file says.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.code_root import CHECKOUT

from .compose_file import (
    COMPOSE_FILE,
    ServiceSpec,
    StackError,
    interpolate,
    interpolate_tree,
    load_compose,
    parse_dockerfile,
    start_order,
)

__all__ = [
    "COMPOSE_FILE",
    "LocalService",
    "RunningService",
    "ServiceSpec",
    "StackError",
    "console_scripts",
    "interpolate",
    "interpolate_tree",
    "kill_and_restart",
    "launch",
    "load_compose",
    "local_program",
    "localize",
    "parse_dockerfile",
    "run_stack",
    "start_order",
]

log = logging.getLogger(__name__)


# -- localizing -----------------------------------------------------------------------------------------------


DISTRIBUTION = "agl"


def console_scripts() -> dict[str, str]:
    """Console script name -> module to run with `python -m`: the entry points of the installed AGL (pyproject.toml's
    [project.scripts], as `pip install` recorded them)."""
    try:
        points = importlib.metadata.distribution(DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        raise StackError(
            f"the {DISTRIBUTION!r} distribution is not installed, so its console scripts (which name the services' "
            "modules) are unknown: install AGL (`pip install -e .` in a checkout, or its wheel)"
        ) from None
    return {
        point.name: point.value.split(":")[0].removesuffix(".__main__")
        for point in points
        if point.group == "console_scripts"
    }


def local_program(argv: Sequence[str], scripts: Mapping[str, str]) -> list[str]:
    """The container argv with its program replaced by what runs it here."""
    if not argv:
        raise StackError("service has no command")
    program, rest = argv[0], list(argv[1:])
    if program in scripts:
        return [sys.executable, "-m", scripts[program], *rest]
    if program in ("python", "python3"):
        return [sys.executable, *rest]
    raise StackError(f"{program!r} is neither a console script of AGL nor python")


@dataclass
class LocalService:
    """A compose service turned into a local process plan."""

    name: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str]
    ports: dict[int, int]


def localize(
    specs: Mapping[str, ServiceSpec],
    data_dir: Path,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    ports: Mapping[tuple[str, int], int] | None = None,
) -> dict[str, LocalService]:
    """Local process plans for specs; see the module docstring for exactly what is rewritten."""
    overrides = overrides or {}
    port_map = dict(ports or {})
    for spec in specs.values():
        for port in spec.ports:
            port_map.setdefault((spec.name, port), free_port())
    scripts = console_scripts()

    def rewrite(text: str, spec: ServiceSpec) -> str:
        for (service, port), local in port_map.items():
            text = re.sub(rf"\b{re.escape(service)}:{port}\b", f"127.0.0.1:{local}", text)
            if service == spec.name:
                text = re.sub(rf"\b(127\.0\.0\.1|localhost):{port}\b", f"127.0.0.1:{local}", text)
        for mount, volume in spec.volumes.items():
            text = text.replace(mount.rstrip("/") + "/", str(data_dir / volume) + "/")
        return text

    plans: dict[str, LocalService] = {}
    for spec in specs.values():
        unknown = set(overrides.get(spec.name, {})) - set(spec.env)
        if unknown:
            raise StackError(f"overrides for {spec.name} name variables its container does not get: {sorted(unknown)}")
        env: dict[str, str] = {}
        for key, value in spec.env.items():
            value = rewrite(value, spec)
            if key == "PYTHONPATH":  # where the image puts the code
                value = code_path()
            elif value == "0.0.0.0":
                value = "127.0.0.1"
            elif key.endswith("_PORT") and value.isdigit() and (spec.name, int(value)) in port_map:
                value = str(port_map[(spec.name, int(value))])
            env[key] = value
        env.update(overrides.get(spec.name, {}))
        for volume in spec.volumes.values():
            (data_dir / volume).mkdir(parents=True, exist_ok=True)
        argv = local_program([rewrite(arg, spec) for arg in spec.argv], scripts)
        health = local_program([rewrite(arg, spec) for arg in spec.healthcheck], scripts) if spec.healthcheck else []
        own_ports = {port: port_map[(spec.name, port)] for port in spec.ports}
        plans[spec.name] = LocalService(spec.name, argv, env, health, own_ports)
    return plans


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- running --------------------------------------------------------------------------------------------------


@dataclass
class RunningService:
    plan: LocalService
    proc: subprocess.Popen[bytes]
    log_path: Path

    def address(self, container_port: int) -> str:
        return f"127.0.0.1:{self.plan.ports[container_port]}"

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


def code_path() -> str:
    """What a service's PYTHONPATH holds for the code: the checkout this runs from; nothing for an installed AGL."""
    return str(CHECKOUT) if CHECKOUT else ""


def child_environment(service_env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without AGL_* settings, plus the service's (as a container would get)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_")}
    users = os.environ.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(service_env)
    # The service's own path (the checkout) first, then the user's: an agent class outside the repo still loads.
    parts = [env.get("PYTHONPATH", "") if "PYTHONPATH" in service_env else code_path(), users]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for part in parts for p in part.split(os.pathsep) if p))
    return env


def exited(running: Mapping[str, RunningService]) -> str:
    """ "" while every service runs; else the first that stopped, its exit status and the end of its log."""
    for name, service in running.items():
        code = service.proc.poll()
        if code is not None:
            return f"{name} exited with {code}; the end of its log ({service.log_path}):\n{service.log_tail(2000)}"
    return ""


def wait_healthy(service: RunningService, timeout_s: float) -> None:
    """Runs the service's health check until it passes (compose's `service_healthy`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if service.proc.poll() is not None:
            raise StackError(f"{service.plan.name} exited with {service.proc.returncode}\n{service.log_tail()}")
        if not service.plan.healthcheck:
            return
        try:
            probe = subprocess.run(
                service.plan.healthcheck, env=child_environment(service.plan.env), capture_output=True, timeout=5
            )
            if probe.returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise StackError(f"{service.plan.name} not healthy after {timeout_s}s\n{service.log_tail()}")
        time.sleep(0.2)


def stop(service: RunningService, timeout_s: float = 15.0) -> int | None:
    """SIGTERM (like `docker stop`), SIGKILL to the process group after timeout_s."""
    proc = service.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", service.plan.name, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def launch(plan: LocalService, log_path: Path) -> RunningService:
    """Starts one service in a session of its own, its output appended to log_path."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            plan.argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_environment(plan.env),
            cwd=CHECKOUT,  # an installed AGL's services run where agl runs
            start_new_session=True,
        )
    log.info("started %s (pid %d): %s", plan.name, proc.pid, shlex.join(plan.argv))
    return RunningService(plan, proc, log_path)


def kill_and_restart(
    running: dict[str, RunningService], name: str, down_s: float = 0.0, health_timeout_s: float = 60.0
) -> float:
    """kill -9 of the service's process group, then the same service again (same ports, same data) after down_s,
    as compose's `restart: unless-stopped` does; replaces it in `running`. Returns the seconds it was away."""
    old = running[name]
    killed_at = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(old.proc.pid, signal.SIGKILL)
    old.proc.wait()
    time.sleep(down_s)
    running[name] = launch(old.plan, old.log_path)
    wait_healthy(running[name], health_timeout_s)
    return time.monotonic() - killed_at


@contextlib.contextmanager
def run_stack(
    plans: Mapping[str, LocalService],
    order: Sequence[str],
    log_dir: Path,
    health_timeout_s: float = 60.0,
    stop_first: Sequence[str] = (),
    when_healthy: Callable[[str, Mapping[str, RunningService]], None] | None = None,
) -> Iterator[dict[str, RunningService]]:
    """Starts the plans in order, each once the ones before are healthy; stops them all in reverse order, the
    ones named in stop_first before the others (a controller before the proxy and the engine its agents call).
    when_healthy(name, running) runs as each service turns healthy, before the next starts (registering an engine
    before a controller can run agents against it)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    running: dict[str, RunningService] = {}
    try:
        for name in order:
            running[name] = launch(plans[name], log_dir / f"{name}.log")
            wait_healthy(running[name], health_timeout_s)
            if when_healthy is not None:
                when_healthy(name, running)
        yield running
    finally:
        first = [name for name in stop_first if name in running]
        for name in [*first, *(name for name in reversed(list(running)) if name not in first)]:
            code = stop(running[name])
            log.info("stopped %s (exit %s)", name, code)
