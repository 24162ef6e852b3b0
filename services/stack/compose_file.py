"""The compose file as data: which services `docker compose` would start, and with what.

For every service built from this repository: the argv its container runs (the image's ENTRYPOINT and CMD,
or the compose `entrypoint`/`command`), its environment (the image's ENV, then the compose `environment`,
interpolated like compose does), its health check, ports, volumes and dependencies. Pure: reads files only.

The compose file is deploy/docker-compose.yaml: a checkout's own, or the copy an installed AGL's wheel carries in
this folder (with the Dockerfiles it builds from, at the same paths relative to it; setup.py copies them).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.code_root import SOURCE_ROOT

# deploy/ as an installed wheel carries it (setup.py), else as a checkout has it.
PACKAGED_DEPLOY = Path(__file__).resolve().parent / "deploy"
_DEPLOY = PACKAGED_DEPLOY if PACKAGED_DEPLOY.is_dir() else SOURCE_ROOT / "deploy"
COMPOSE_FILE = _DEPLOY / "docker-compose.yaml"
_INTERPOLATION = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class StackError(RuntimeError):
    """The compose file cannot be run locally, or a service did not start."""


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """Compose variable substitution: $$, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match["name"], match["op"] or "", match["arg"] or ""
        value = variables.get(name)
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if missing else str(value)
        if op.endswith("?") and missing:
            raise StackError(f"compose variable {name} is required: {arg}")
        return "" if value is None else str(value)

    return _INTERPOLATION.sub(substitute, text)


def interpolate_tree(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [interpolate_tree(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, variables) for key, value in node.items()}
    return node


# -- Dockerfiles ----------------------------------------------------------------------------------------------


@dataclass
class ImageConfig:
    """What a Dockerfile stage says about how its container runs."""

    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            yield keyword.upper(), rest.strip()


def _exec_form(text: str) -> list[str]:
    if text.startswith("["):
        return [str(item) for item in json.loads(text)]
    return ["/bin/sh", "-c", text]


def parse_dockerfile(path: Path, target: str | None = None) -> ImageConfig:
    """ENV, ENTRYPOINT, CMD and HEALTHCHECK of the target stage (default: the last), following FROM <stage>."""
    stages: dict[str, ImageConfig] = {}
    current: ImageConfig | None = None
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "FROM":
            words = rest.split()
            parent = stages.get(words[0].lower()) or ImageConfig()
            current = ImageConfig(dict(parent.env), list(parent.entrypoint), list(parent.cmd), list(parent.healthcheck))
            name = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages[name] = current
            stages["__last__"] = current
        elif current is None:
            continue
        elif keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                current.env[key] = value
        elif keyword == "ENTRYPOINT":
            current.entrypoint, current.cmd = _exec_form(rest), []
        elif keyword == "CMD":
            current.cmd = _exec_form(rest)
        elif keyword == "HEALTHCHECK":
            _, _, command = rest.partition("CMD ")
            current.healthcheck = _exec_form(command.strip()) if command else []
    stage = stages.get((target or "__last__").lower())
    if stage is None:
        raise StackError(f"{path}: no stage {target!r}")
    return stage


# -- compose --------------------------------------------------------------------------------------------------


@dataclass
class ServiceSpec:
    """One compose service as its container would run."""

    name: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str]
    ports: list[int]
    volumes: dict[str, str]
    depends_on: list[str]


def _container_port(entry: Any) -> int:
    text = str(entry).split("/")[0]
    return int(text.rsplit(":", 1)[-1])


def _healthcheck_argv(test: Any) -> list[str]:
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    if not test or test[0] == "NONE":
        return []
    if test[0] == "CMD":
        return [str(item) for item in test[1:]]
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", str(test[1])]
    return [str(item) for item in test]


def load_compose(
    variables: Mapping[str, str], profiles: Sequence[str] = (), path: Path = COMPOSE_FILE
) -> dict[str, ServiceSpec]:
    """The services compose would start with these profiles, as ServiceSpecs (only services built here)."""
    if not path.is_file():
        raise StackError(
            f"no compose file at {path}: an installed AGL carries it in its wheel (services/stack/deploy, built by "
            "setup.py from deploy/), a checkout has it in deploy/; reinstall AGL from a wheel built from a checkout"
        )
    document = interpolate_tree(yaml.safe_load(path.read_text()), variables)
    services: dict[str, Any] = document["services"]
    images = {
        svc["image"]: svc["build"] for svc in services.values() if isinstance(svc.get("build"), dict) and "image" in svc
    }
    specs: dict[str, ServiceSpec] = {}
    for name, svc in services.items():
        if svc.get("profiles") and not set(svc["profiles"]) & set(profiles):
            continue
        if svc.get("restart") == "no":
            continue  # a one-shot job (an engine's registration): local callers register the engine themselves
        build = svc.get("build") or images.get(svc.get("image", ""))
        if not isinstance(build, dict):
            continue  # a third-party image (vLLM): not something to run from this checkout
        image = parse_dockerfile((path.parent / build["context"] / build["dockerfile"]).resolve(), build.get("target"))
        entrypoint = [str(x) for x in svc["entrypoint"]] if "entrypoint" in svc else image.entrypoint
        # Like compose: `command` replaces CMD, and setting `entrypoint` drops the image's CMD.
        command = [str(x) for x in svc.get("command", [] if "entrypoint" in svc else image.cmd)]
        env = dict(image.env)
        environment = svc.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        env.update({key: "" if value is None else str(value) for key, value in environment.items()})
        healthcheck = _healthcheck_argv(svc["healthcheck"]["test"]) if "healthcheck" in svc else image.healthcheck
        ports = sorted({_container_port(p) for p in [*svc.get("ports", []), *svc.get("expose", [])]})
        volumes = {}
        for mount in svc.get("volumes", []):
            source, _, target = str(mount).partition(":")
            volumes[target.split(":")[0]] = source
        depends = svc.get("depends_on") or []
        specs[name] = ServiceSpec(name, entrypoint + command, env, healthcheck, ports, volumes, list(depends))
    for spec in specs.values():
        spec.depends_on = [dep for dep in spec.depends_on if dep in specs]
    return specs


def start_order(specs: Mapping[str, ServiceSpec]) -> list[str]:
    """Service names, every one after the services it depends on."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise StackError(f"dependency cycle: {' -> '.join((*path, name))}")
        for dep in specs[name].depends_on:
            visit(dep, (*path, name))
        order.append(name)

    for name in specs:
        visit(name, ())
    return order
