"""deploy/k8s: every manifest valid against the Kubernetes API schema and wired together consistently."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import yaml

from services.stack import local_stack
from tests.deploy.conftest import K8S, config_env_names
from tests.deploy.k8s_schema import validate

# Variables a container may get that its service does not read itself.
PASS_THROUGH = {"PYTHONUNBUFFERED"}


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _manifests() -> list[dict[str, Any]]:
    documents = []
    for name in _kustomization()["resources"]:
        documents += [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]
    return documents


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _manifests() if doc["kind"] == kind}


def _workloads() -> dict[str, dict[str, Any]]:
    return {**_by_kind("Deployment"), **_by_kind("StatefulSet")}


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def test_kustomization_lists_every_manifest_including_the_controller_rbac() -> None:
    listed = _kustomization()["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert "controller-rbac.yaml" in listed
    assert _kustomization()["namespace"] == "agl"


def test_every_manifest_is_valid_against_the_api_schema() -> None:
    for doc in _manifests():
        assert validate(doc) == [], doc["metadata"]["name"]


def test_the_expected_objects_are_there() -> None:
    kinds = Counter(doc["kind"] for doc in _manifests())
    assert kinds["StatefulSet"] == 1 and kinds["Deployment"] == 3 and kinds["Secret"] == 1
    assert set(_by_kind("StatefulSet")) == {"agl-ledger"}
    assert set(_by_kind("Deployment")) == {"agl-proxy", "agl-controller", "agl-console"}
    assert {"agl-ledger", "agl-proxy", "agl-console"} <= set(_by_kind("Service"))
    assert kinds["ServiceAccount"] >= 1 and kinds["RoleBinding"] + kinds["ClusterRoleBinding"] >= 1


def test_validation_catches_a_misspelt_field() -> None:
    workload = yaml.safe_load(yaml.safe_dump(_workloads()["agl-proxy"]))
    container = _containers(workload)[0]
    container["readinesProbe"] = container.pop("readinessProbe")
    assert any("readinesProbe" in error for error in validate(workload))


def test_selectors_match_the_pod_labels() -> None:
    for name, workload in _workloads().items():
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in _workloads().values()]
    for name, service in _by_kind("Service").items():
        selector = service["spec"]["selector"]
        matching = [labels for labels in pods if selector.items() <= labels.items()]
        assert len(matching) == 1, f"Service {name} selects {len(matching)} workloads"
    for name, budget in _by_kind("PodDisruptionBudget").items():
        assert any(budget["spec"]["selector"]["matchLabels"].items() <= labels.items() for labels in pods), name


def test_service_ports_point_at_named_container_ports() -> None:
    workloads = list(_workloads().values())
    for name, service in _by_kind("Service").items():
        selector = service["spec"]["selector"]
        workload = next(w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items())
        names = {port["name"] for c in _containers(workload) for port in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names, (name, port)


def test_ledger_is_a_statefulset_with_its_store_on_a_claim() -> None:
    ledger = _by_kind("StatefulSet")["agl-ledger"]
    assert ledger["spec"]["replicas"] == 1
    claim = ledger["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    container = _containers(ledger)[0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    store = next(e["value"] for e in container["env"] if e["name"] == "AGL_LEDGER_STORE")
    assert store == f"sqlite:{mount['mountPath']}/ledger.db"
    assert ledger["spec"]["serviceName"] in _by_kind("Service")
    assert _by_kind("Service")[ledger["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_proxy_runs_at_least_two_replicas() -> None:
    assert _workloads()["agl-proxy"]["spec"]["replicas"] >= 2


@pytest.mark.parametrize("name", ["agl-ledger", "agl-proxy", "agl-controller", "agl-console"])
def test_workloads_have_probes_and_run_as_non_root(name: str) -> None:
    workload = _workloads()[name]
    container = _containers(workload)[0]
    assert "readinessProbe" in container and "livenessProbe" in container
    assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_probes_use_what_each_service_serves() -> None:
    """Readiness and liveness are different checks (test_k8s_probes.py runs them against the real services)."""
    ledger = _containers(_workloads()["agl-ledger"])[0]
    assert ledger["readinessProbe"]["grpc"]["port"] == 50051
    assert ledger["livenessProbe"]["grpc"]["service"] == "liveness"
    for name in ("agl-proxy", "agl-controller", "agl-console"):
        container = _containers(_workloads()[name])[0]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name


def test_commands_are_console_scripts_and_env_names_are_read_by_the_service() -> None:
    scripts = local_stack.console_scripts()
    for name, workload in _workloads().items():
        for container in _containers(workload):
            program = container["command"][0]
            assert program in scripts, f"{name} runs {program}, not a console script of pyproject.toml"
            read = config_env_names(scripts[program])
            given = {item["name"] for item in container.get("env", [])} - PASS_THROUGH
            assert given <= read, f"{name} is given {sorted(given - read)}, never read by {scripts[program]}"


def test_secret_references_resolve() -> None:
    secrets = _by_kind("Secret")
    for name, workload in _workloads().items():
        for container in _containers(workload):
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, (name, ref)
                    assert ref["key"] in secrets[ref["name"]]["stringData"], (name, ref)
    keyed = {
        name
        for name, w in _workloads().items()
        if any(e["name"] == "AGL_KEY" and "valueFrom" in e for c in _containers(w) for e in c.get("env", []))
    }
    assert keyed == {"agl-ledger", "agl-proxy", "agl-controller", "agl-console"}
    # The engines' key, as compose passes AGL_ENGINE_API_KEY to the proxy: from the Secret, never inline.
    (proxy,) = _containers(_workloads()["agl-proxy"])
    (engine_key,) = [e for e in proxy["env"] if e["name"] == "AGL_ENGINE_API_KEY"]
    assert engine_key["valueFrom"]["secretKeyRef"] == {"name": "agl-key", "key": "engine-api-key", "optional": True}


def test_services_find_each_other_by_service_name() -> None:
    services = _by_kind("Service")
    for name, workload in _workloads().items():
        for container in _containers(workload):
            env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
            if "AGL_LEDGER_ADDR" in env:
                host, port = env["AGL_LEDGER_ADDR"].split(":")
                assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, name
            if "AGL_PROXY_URL" in env:
                host, port = env["AGL_PROXY_URL"].removeprefix("http://").split(":")
                assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, name


def test_controller_runs_jobs_with_the_rbac_service_account() -> None:
    controller = _workloads()["agl-controller"]
    account = controller["spec"]["template"]["spec"]["serviceAccountName"]
    assert account in _by_kind("ServiceAccount")
    bindings = [*_by_kind("RoleBinding").values(), *_by_kind("ClusterRoleBinding").values()]
    bound = [b for b in bindings if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])]
    assert bound, "no binding gives the controller's service account its role"
    roles = {**_by_kind("Role"), **_by_kind("ClusterRole")}
    verbs = {
        verb
        for binding in bound
        for rule in roles[binding["roleRef"]["name"]]["rules"]
        if "batch" in rule.get("apiGroups", []) and "jobs" in rule.get("resources", [])
        for verb in rule["verbs"]
    }
    assert {"create", "get", "list", "watch", "delete"} <= verbs
    container = _containers(controller)[0]
    assert "k8s" in container.get("args", []) or any(
        e["name"].endswith("RUNNER") and e.get("value") == "k8s" for e in container.get("env", [])
    )
