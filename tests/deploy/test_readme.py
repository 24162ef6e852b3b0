"""The manual (README.md and the documentation site's pages under docs/): its grpcurl calls name real methods with
bodies that parse (and the unary ones run against a real ledger), and its compose, Kubernetes and trainer commands
name things that exist."""

from __future__ import annotations

import re
import shlex

import grpc
import pytest
import yaml
from google.protobuf import json_format

from services._gen.agl.v1 import ledger_service_pb2
from tests.deploy.conftest import DEPLOY, REPO_ROOT
from tests.support.procs import start_ledger

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
TEXT = "\n".join(page.read_text() for page in PAGES)
SERVICE = ledger_service_pb2.DESCRIPTOR.services_by_name["LedgerService"]


def _grpcurl_calls() -> list[list[str]]:
    lines = [line for line in TEXT.splitlines() if line.startswith("grpcurl ")]
    return [shlex.split(line) for line in lines]


def _request(argv: list[str]):
    method = SERVICE.methods_by_name[argv[-1].split("/")[-1]]
    body = argv[argv.index("-d") + 1] if "-d" in argv else "{}"
    request_class = getattr(ledger_service_pb2, method.input_type.name)
    return method, json_format.Parse(body, request_class())


def test_every_grpcurl_call_names_a_real_method_and_its_body_parses() -> None:
    calls = _grpcurl_calls()
    assert len(calls) >= 10
    for argv in calls:
        assert argv[:2] == ["grpcurl", "-plaintext"]
        target = argv[-1]
        if target in ("list",) or argv[-2] == "describe":
            continue
        if target.startswith("grpc.health.v1.Health/"):
            assert target == "grpc.health.v1.Health/Check"
            continue
        assert target.startswith("agl.v1.LedgerService/"), target
        _request(argv)  # raises on an unknown method or a body that is not the request message


async def test_unary_grpcurl_calls_succeed_against_a_real_ledger() -> None:
    with start_ledger() as ledger:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            created_id = ""
            # The by-hand CreateRollouts first: ListEvents then asks for the rollout it made.
            calls = sorted(_grpcurl_calls(), key=lambda argv: not argv[-1].endswith("/CreateRollouts"))
            for argv in calls:
                if not argv[-1].startswith("agl.v1.LedgerService/"):
                    continue
                method, request = _request(argv)
                if method.server_streaming:
                    continue
                if method.name == "ListEvents":
                    request.rollout_id = created_id
                response_class = getattr(ledger_service_pb2, method.output_type.name)
                call = channel.unary_unary(
                    f"/{SERVICE.full_name}/{method.name}",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response_class.FromString,
                )
                response = await call(request, timeout=10)
                if method.name == "CreateRollouts":
                    created_id = response.rollouts[0].rollout_id
            assert created_id, "the documented CreateRollouts example did not run"


def test_the_pages_that_hold_the_commands_are_read() -> None:
    """The commands these tests check live on these pages (moved out of the README); each is read."""
    read = {page.relative_to(REPO_ROOT).as_posix() for page in PAGES}
    for page, command in {
        "docs/reference/grpcurl.md": "grpcurl -plaintext",
        "docs/deploy/compose.md": "--profile ",
        "docs/deploy/kubernetes.md": "| `ledger.yaml` |",
        "docs/training/ray.md": "=train",
    }.items():
        assert page in read and command in (REPO_ROOT / page).read_text(), page


def test_compose_profiles_and_files_the_text_names_exist() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    profiles = {p for svc in compose["services"].values() for p in svc.get("profiles", [])}
    assert set(re.findall(r"--profile ([\w-]+)", TEXT)) == profiles
    for path in set(re.findall(r"`((?:deploy|examples|services)/[\w./-]+)`", TEXT)):
        if "<" not in path:
            assert (REPO_ROOT / path).exists(), path
    for name in re.findall(r"^\| `(\w[\w-]*\.yaml)` \|", TEXT, flags=re.M):
        assert (DEPLOY / "k8s" / name).is_file(), name


@pytest.mark.parametrize("agent", re.findall(r"\+(\w+)=train", TEXT))
def test_trainer_command_names_an_example_config(agent: str) -> None:
    assert (REPO_ROOT / "examples" / agent / "train.yaml").is_file()
