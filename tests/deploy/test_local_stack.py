"""services/stack/local_stack.py: how the compose file becomes local processes (what the demo and e2e tests run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.stack import local_stack
from services.stack.local_stack import StackError, interpolate


def test_interpolation_follows_compose_rules() -> None:
    variables = {"SET": "value", "EMPTY": ""}
    assert interpolate("${SET}", variables) == "value"
    assert interpolate("${UNSET}", variables) == ""
    assert interpolate("${UNSET:-fallback}", variables) == "fallback"
    assert interpolate("${EMPTY:-fallback}", variables) == "fallback"
    assert interpolate("${EMPTY-fallback}", variables) == ""
    assert interpolate("${SET:-fallback}", variables) == "value"
    assert interpolate("cost $$5 ${SET}", variables) == "cost $5 value"
    with pytest.raises(StackError, match="NEEDED is required: give it"):
        interpolate("${NEEDED:?give it}", variables)


def test_dockerfile_stages_inherit_and_the_target_is_chosen(tmp_path: Path) -> None:
    dockerfile = tmp_path / "x.Dockerfile"
    dockerfile.write_text(
        "FROM python:3.11-slim AS base\n"
        "ENV A=1 \\\n    B=two\n"
        'HEALTHCHECK --interval=5s CMD ["python", "-c", "pass"]\n'
        "FROM base AS first\n"
        'ENTRYPOINT ["agl-ledger"]\n'
        'CMD ["--store", "memory"]\n'
        "FROM base AS last\n"
        "ENV B=three\n"
        "ENTRYPOINT agl-proxy --port 1\n"
    )
    first = local_stack.parse_dockerfile(dockerfile, "first")
    assert first.env == {"A": "1", "B": "two"}
    assert first.entrypoint == ["agl-ledger"] and first.cmd == ["--store", "memory"]
    assert first.healthcheck == ["python", "-c", "pass"]
    last = local_stack.parse_dockerfile(dockerfile)
    assert last.env == {"A": "1", "B": "three"}
    assert last.entrypoint == ["/bin/sh", "-c", "agl-proxy --port 1"] and last.cmd == []
    with pytest.raises(StackError, match="no stage"):
        local_stack.parse_dockerfile(dockerfile, "missing")


def test_compose_services_run_their_image_commands_with_compose_environment() -> None:
    specs = local_stack.load_compose({"AGL_KEY": "sekret", "AGL_MODEL_NAME": "m"}, profiles=["standin"])
    assert set(specs) == {"ledger", "proxy", "controller", "standin"}
    assert specs["ledger"].argv == ["agl-ledger"]
    assert specs["ledger"].env["AGL_KEY"] == "sekret"
    assert specs["proxy"].env["AGL_MODEL_NAME"] == "m"
    assert specs["standin"].argv == ["agl-standin-engine"]
    assert specs["controller"].argv[0] == "agl-controller"
    assert local_stack.start_order(specs).index("ledger") < local_stack.start_order(specs).index("proxy")
    assert local_stack.start_order(specs)[-1] in ("controller", "standin")
    without = local_stack.load_compose({}, profiles=[])
    assert set(without) == {"ledger", "proxy", "controller"}
    assert without["proxy"].env["AGL_MODEL_NAME"] == "agl-policy"


def test_localize_rewrites_only_addresses_ports_and_volume_paths(tmp_path: Path) -> None:
    specs = local_stack.load_compose({}, profiles=["standin"])
    plans = local_stack.localize(specs, tmp_path, {"controller": {"AGL_CONTROLLER_LOG_DIR": str(tmp_path / "a")}})
    ledger, proxy, controller = plans["ledger"], plans["proxy"], plans["controller"]
    assert ledger.argv == [sys.executable, "-m", "services.ledger"]
    assert ledger.env["AGL_LEDGER_HOST"] == "127.0.0.1"
    ledger_port = ledger.ports[50051]
    assert ledger.env["AGL_LEDGER_PORT"] == str(ledger_port)
    assert ledger.env["AGL_LEDGER_STORE"] == f"sqlite:{tmp_path}/ledger-data/ledger.db"
    assert (tmp_path / "ledger-data").is_dir()
    assert proxy.env["AGL_LEDGER_ADDR"] == f"127.0.0.1:{ledger_port}"
    assert controller.env["AGL_PROXY_URL"] == f"http://127.0.0.1:{proxy.ports[8080]}"
    assert controller.env["AGL_CONTROLLER_LOG_DIR"] == str(tmp_path / "a")
    assert specs["controller"].env["PYTHONPATH"] == "/app"  # agent classes import from the image's copy
    assert controller.env["PYTHONPATH"] == str(Path(__file__).resolve().parents[2])  # the checkout, as the image's copy
    assert plans["standin"].healthcheck[-1].count(f"127.0.0.1:{plans['standin'].ports[8000]}") == 1
    # Everything else is exactly what the container gets.
    for name, plan in plans.items():
        assert set(plan.env) == set(specs[name].env)
        for key, value in plan.env.items():
            original = specs[name].env[key]
            if value != original:
                rewritten = ("_HOST", "_PORT", "_ADDR", "_URL", "_STORE", "_LOG_DIR", "PYTHONPATH")
                assert key.endswith(rewritten), (name, key)


def test_overrides_cannot_add_settings_compose_does_not_give(tmp_path: Path) -> None:
    specs = local_stack.load_compose({}, profiles=[])
    with pytest.raises(StackError, match="AGL_SOMETHING_NEW"):
        local_stack.localize(specs, tmp_path, {"proxy": {"AGL_SOMETHING_NEW": "1"}})


def test_programs_must_be_console_scripts_or_python() -> None:
    scripts = local_stack.console_scripts()
    assert scripts["agl-ledger"] == "services.ledger"
    assert local_stack.local_program(["python", "x.py"], scripts) == [sys.executable, "x.py"]
    with pytest.raises(StackError, match="neither a console script"):
        local_stack.local_program(["bash", "-c", "true"], scripts)
