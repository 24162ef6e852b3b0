"""deploy/docker-compose.yaml: valid for Debian's docker-compose, and wired the way the services read it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from services.client import LedgerClient
from services.stack import local_stack
from tests.deploy.conftest import DEPLOY, REPO_ROOT, config_env_names
from tests.support.procs import start_ledger

COMPOSE = DEPLOY / "docker-compose.yaml"
PROFILES = ("standin", "vllm", "engine", "ray", "ray-cpu", "console")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _docker_compose(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed (Debian: apt-get install docker-compose); it validates the file")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AGL_", "COMPOSE_"))}
    return subprocess.run(
        [binary, "-f", str(COMPOSE), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_docker_compose_accepts_the_file_with_every_profile() -> None:
    profile_args = [arg for profile in PROFILES for arg in ("--profile", profile)]
    result = _docker_compose(*profile_args, "config")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == {
        "ledger",
        "proxy",
        "controller",
        "standin",
        "register-standin",
        "vllm",
        "register-vllm",
        "engine",
        "register-engine",
        "ray-head",
        "ray-head-cpu",
        "console",
    }
    assert set(resolved["volumes"]) >= {"ledger-data"}


def test_plain_up_starts_ledger_proxy_and_controller() -> None:
    result = _docker_compose("config")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {name for name, svc in services.items() if not svc.get("profiles")} == {"ledger", "proxy", "controller"}


def test_docker_compose_rejects_a_broken_file(tmp_path) -> None:
    # The validation above means something: a typo in a key is an error.
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("depends_on:", "depend_on:", 1))
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed (Debian: apt-get install docker-compose)")
    result = subprocess.run([binary, "-f", str(broken), "config", "-q"], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "depend_on" in result.stderr


def test_ports_for_grpcurl_and_agents_are_published() -> None:
    services = _compose()["services"]
    assert any(str(p).endswith(":50051") for p in services["ledger"]["ports"])
    assert any(str(p).endswith(":8080") for p in services["proxy"]["ports"])


def test_ledger_store_lives_on_a_named_volume() -> None:
    document = _compose()
    ledger = document["services"]["ledger"]
    store = ledger["environment"]["AGL_LEDGER_STORE"]
    assert store.startswith("sqlite:")
    mounts = dict(str(v).split(":", 1) for v in ledger["volumes"])
    assert mounts["ledger-data"] == "/data" and store.removeprefix("sqlite:").startswith("/data/")
    assert "ledger-data" in document["volumes"]


def test_start_order_waits_for_health() -> None:
    specs = local_stack.load_compose({}, PROFILES)
    services = _compose()["services"]
    for name, service in services.items():
        for dep, condition in (service.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dep)
            has_check = "healthcheck" in services[dep] or (dep in specs and specs[dep].healthcheck)
            assert has_check, f"{name} waits for {dep} to be healthy, but {dep} has no health check"
    assert set(services["proxy"]["depends_on"]) == {"ledger"}
    assert set(services["controller"]["depends_on"]) == {"ledger", "proxy"}


def test_every_container_setting_is_one_its_service_reads() -> None:
    scripts = local_stack.console_scripts()
    for name, spec in local_stack.load_compose({}, PROFILES).items():
        given = {key for key in spec.env if key.startswith("AGL_")}
        module = scripts.get(spec.argv[0])
        if module is None:  # ray-head(-cpu): the trainer jobs it runs read these through their Hydra config
            # The trainer's config and its placements (AGL_WEIGHTS_DIR: placement/cpu.yaml).
            configs = sorted((REPO_ROOT / "services" / "trainer" / "hydra-conf").rglob("*.yaml"))
            read = {name for path in configs for name in re.findall(r"oc\.env:(AGL_[A-Z0-9_]+)", path.read_text())}
            assert given and given <= read, f"{name} is given {sorted(given - read)}, which the trainer never reads"
            continue
        read = config_env_names(module)
        if name == "standin":  # the proxy image's own defaults ride along, unread
            given -= {"AGL_PROXY_HOST", "AGL_PROXY_PORT"}
        assert given <= read, f"{name} is given {sorted(given - read)}, which {module}/config.py never reads"


def test_every_command_is_a_console_script_or_a_third_party_image() -> None:
    scripts = local_stack.console_scripts()
    specs = local_stack.load_compose({}, PROFILES)
    assert {spec.argv[0] for spec in specs.values()} == {
        "agl-ledger",
        "agl-proxy",
        "agl-controller",
        "agl-standin-engine",
        "agl-engine",
        "agl-console",
        "ray",
    }
    for spec in specs.values():
        assert spec.argv[0] in scripts or spec.argv[0] == "ray", spec
    services = _compose()["services"]
    third_party = {name for name, svc in services.items() if "build" not in svc and name not in specs}
    one_shot = {name for name, svc in services.items() if svc.get("restart") == "no"}
    assert third_party - one_shot == {"vllm"}
    # The registrations run the proxy image's Python: nothing from a registry the user has not built.
    assert {services[name]["image"] for name in one_shot} == {"agl-proxy:${AGL_IMAGE_TAG:-latest}"}


@pytest.mark.parametrize(
    ("service", "engine"), [("register-standin", "standin"), ("register-vllm", "vllm"), ("register-engine", "engine")]
)
def test_engine_registration_registers_the_engine_with_a_real_ledger(service: str, engine: str) -> None:
    # The one-shot's own script and arguments, as compose interpolates them with the key set, run against a
    # real ledger that requires the key: the endpoint is then in the registry.
    key = "register-test-key"
    svc = local_stack.interpolate_tree(_compose(), {"AGL_KEY": key})["services"][service]
    entrypoint, args = svc["entrypoint"], svc["command"]
    assert entrypoint[:2] == ["python", "-c"] and args[0] == "ledger:50051"
    assert svc["environment"]["AGL_KEY"] == key
    with start_ledger(key=key) as ledger:
        env = {**os.environ, "AGL_KEY": key, "PYTHONPATH": str(REPO_ROOT)}
        argv = [sys.executable, "-c", entrypoint[2], f"127.0.0.1:{ledger.port}", *args[1:]]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
        assert result.returncode == 0, result.stderr

        async def registered() -> list[tuple[str, str]]:
            async with LedgerClient(f"127.0.0.1:{ledger.port}", key=key) as client:
                return [(e.model_name, e.endpoint) for e in await client.list_models()]

        assert asyncio.run(registered()) == [("agl-policy", f"http://{engine}:8000/v1")]
        # Without the key the ledger refuses it, and the one-shot says so with a non-zero exit.
        env.pop("AGL_KEY")
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
        assert result.returncode != 0 and "UNAUTHENTICATED" in result.stderr


def test_gpu_profiles_reserve_gpus() -> None:
    services = _compose()["services"]
    for name in ("vllm", "ray-head"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
    assert services["vllm"]["profiles"] == ["vllm"]
    assert services["ray-head"]["profiles"] == ["ray"]
    assert "8265:8265" in [str(p).split("-")[-1].replace("}", "") for p in services["ray-head"]["ports"]]
