"""deploy/k8s's ledger and proxy as `podman kube play` (podman 4.3) can run them: the same containers, little else.

What podman 4.3 cannot take as written, and what this renders instead (pure: reads files, returns documents):
- it plays only Pods, Deployments and PersistentVolumeClaims: the ledger's StatefulSet becomes one Pod named like
  its Service (`agl-ledger`, the name the proxy dials), its claim template a PersistentVolumeClaim;
- it publishes every containerPort on 0.0.0.0 of the host, and one Deployment's replicas would collide on them:
  every port gets hostIP 127.0.0.1 and a host port of the caller's choice, and the proxy runs one replica;
- `secretKeyRef` reads a podman secret whose content is a JSON map of base64 values: `secret_content` makes it
  from deploy/k8s/secret.yaml.
Services, PodDisruptionBudgets and the like have no podman counterpart and are left out.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parent / "k8s"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _pin_ports(pod_spec: dict[str, Any], host_ports: Mapping[int, int]) -> None:
    for container in pod_spec["containers"]:
        for port in container.get("ports", []):
            number = port["containerPort"]
            if number not in host_ports:
                raise ValueError(f"no host port given for {container['name']}'s port {number}")
            port["hostIP"] = "127.0.0.1"
            port["hostPort"] = host_ports[number]


def render(host_ports: Mapping[int, int], k8s_dir: Path = K8S) -> list[dict[str, Any]]:
    """The ledger Pod with its claim and the proxy Deployment, every container port on 127.0.0.1."""
    (statefulset,) = [d for d in _documents(k8s_dir / "ledger.yaml") if d["kind"] == "StatefulSet"]
    (deployment,) = [d for d in _documents(k8s_dir / "proxy.yaml") if d["kind"] == "Deployment"]
    template = copy.deepcopy(statefulset["spec"]["template"])
    claims = []
    for claim in statefulset["spec"].get("volumeClaimTemplates", []):
        name = f"{statefulset['metadata']['name']}-{claim['metadata']['name']}"
        claims.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", **copy.deepcopy(claim)})
        claims[-1]["metadata"]["name"] = name
        volume = {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": name}}
        template["spec"].setdefault("volumes", []).append(volume)
    _pin_ports(template["spec"], host_ports)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": statefulset["metadata"]["name"], "labels": template["metadata"].get("labels", {})},
        "spec": template["spec"],
    }
    deployment = copy.deepcopy(deployment)
    deployment["spec"]["replicas"] = 1
    _pin_ports(deployment["spec"]["template"]["spec"], host_ports)
    return [*claims, pod, deployment]


def secret_content(k8s_dir: Path = K8S) -> tuple[str, bytes]:
    """(name, content) of the podman secret standing for deploy/k8s/secret.yaml."""
    (secret,) = _documents(k8s_dir / "secret.yaml")
    values = {key: value.encode() for key, value in (secret.get("stringData") or {}).items()}
    values.update({key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()})
    return secret["metadata"]["name"], json.dumps({k: base64.b64encode(v).decode() for k, v in values.items()}).encode()


def secret_value(key: str, k8s_dir: Path = K8S) -> str:
    (secret,) = _documents(k8s_dir / "secret.yaml")
    return (secret.get("stringData") or {}).get(key) or base64.b64decode(secret["data"][key]).decode()
