"""Checks a Kubernetes manifest against the API's own schema, as the official client's models describe it.

Every key must be a field of its object, every value of the field's type; a misspelt `readinesProbe` or a
string where a list belongs is reported with its path. Where the client's models are pydantic models, the
fields the API requires are checked too.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client as k8s

KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
}
_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict|dict)\[?\(?str, (.+?)\)?\]?$")
_SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _check(value: Any, type_name: str, path: str, errors: list[str]) -> None:
    if value is None:
        return
    if match := _LIST.match(type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for index, item in enumerate(value):
            _check(item, match.group(1), f"{path}[{index}]", errors)
        return
    if match := _DICT.match(type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return
        for key, item in value.items():
            _check(item, match.group(1), f"{path}.{key}", errors)
        return
    if type_name in _SCALARS:
        if not isinstance(value, _SCALARS[type_name]) or (type_name == "int" and isinstance(value, bool)):
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name in ("object", "datetime", "date", "bytearray"):
        return
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} mapping, got {type(value).__name__}")
        return
    fields = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: not a field of {type_name}")
            continue
        _check(item, model.openapi_types[fields[key]], f"{path}.{key}", errors)


def validate(manifest: dict[str, Any]) -> list[str]:
    """Schema errors of one manifest; empty when it is a valid object of a known kind."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key not in KINDS:
        return [f"unknown apiVersion/kind {key}"]
    errors: list[str] = []
    _check(manifest, KINDS[key], manifest["kind"], errors)
    model = getattr(k8s, KINDS[key])
    if not errors and hasattr(model, "model_validate"):  # pydantic models (client >= 35) also know required fields
        try:
            model.model_validate(manifest)
        except ValueError as err:
            errors.append(f"{manifest['kind']}: {err}")
    return errors
