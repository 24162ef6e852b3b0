"""Pure rendering of a rollout's Kubernetes Job: Jinja2 template in, one batch/v1 Job manifest out.

Everything that must hold for the controller to find and judge the Job again is forced here, whatever the
template says: the deterministic name, namespace, labels, backoffLimit 0, restartPolicy Never, the deadline,
the TTL after finishing and the §3 variables in every container.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from .outcome import ConfigError

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "agl-controller"
ROLLOUT_LABEL = "agl.io/rollout-id"
ATTEMPT_LABEL = "agl.io/attempt-id"
# Label values may be hashed to fit; the annotations keep the exact ids.
ROLLOUT_ANNOTATION = "agl.io/rollout-id"
ATTEMPT_ANNOTATION = "agl.io/attempt-id"
CONTROLLER_ANNOTATION = "agl.io/controller-id"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

_NAME_PREFIX = "agl-"
_HASH_LEN = 10
_LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def job_name(rollout_id: str) -> str:
    """Deterministic DNS-1123 label (<= 63 chars) for the rollout's Job: readable stem plus a short hash."""
    room = 63 - len(_NAME_PREFIX) - 1 - _HASH_LEN
    stem = re.sub(r"[^a-z0-9]+", "-", rollout_id.lower()).strip("-")[:room].strip("-")
    return f"{_NAME_PREFIX}{stem}-{_digest(rollout_id)}" if stem else f"{_NAME_PREFIX}{_digest(rollout_id)}"


def label_value(value: str) -> str:
    """`value` when it is a valid label value, else a valid stand-in made of its safe part and a hash."""
    if _LABEL_VALUE_RE.fullmatch(value):
        return value
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[: 63 - 1 - _HASH_LEN].strip("-_.")
    return f"{stem}-{_digest(value)}" if stem else _digest(value)


# -- yaml_escape ----------------------------------------------------------------------------------------------

_SHORT_ESCAPES = {"\0": "\\0", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f"}
_SHORT_ESCAPES |= {"\r": "\\r", "\x1b": "\\e", '"': '\\"', "\\": "\\\\"}


def _printable(ch: str) -> bool:
    return " " <= ch <= "~" or ("\xa0" <= ch <= "\ud7ff" and ch not in "\u2028\u2029") or "\ue000" <= ch <= "\ufffd"


def _quote(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif _printable(ch) and ch != "\ufeff":
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    # YAML 1.1 (PyYAML) reads "1e+20" as a string; "1.0e+20" is a float.
    if "e" in text and "." not in text:
        mantissa, _, exponent = text.partition("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def yaml_escape(value: Any) -> str:
    """One-line YAML flow node for any JSON-like value; strings always double-quoted, so safe anywhere."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError naming the missing field
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_quote(str(k))}: {yaml_escape(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_escape(v) for v in value) + "]"
    return _quote(str(value))


# -- rendering ------------------------------------------------------------------------------------------------

_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
_ENV.filters["yaml_escape"] = yaml_escape


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> jinja2.Template:
    return _ENV.from_string(template)


def render_text(template: str, context: Mapping[str, Any]) -> str:
    """The template rendered with `context`; any template error becomes ConfigError."""
    try:
        return _compile(template).render(**context)
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(f"invalid Job template: syntax error at line {err.lineno}: {err.message}") from err
    except jinja2.UndefinedError as err:
        raise ConfigError(f"invalid Job template: {err.message}") from err
    except Exception as err:
        raise ConfigError(f"invalid Job template: {type(err).__name__}: {err}") from err


def parse_job(text: str) -> dict[str, Any]:
    """Exactly one YAML document, a batch/v1 Job with at least one container."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        raise ConfigError(f"Job template did not render to valid YAML: {err}") from err
    if len(documents) != 1:
        raise ConfigError(f"Job template must render exactly one YAML document, got {len(documents)}")
    job = documents[0]
    if not isinstance(job, dict):
        raise ConfigError(f"Job template must render a mapping, got {type(job).__name__}")
    if job.get("kind") != "Job":
        raise ConfigError(f"Job template must render kind Job, got {job.get('kind')!r}")
    job.setdefault("apiVersion", "batch/v1")
    if job["apiVersion"] != "batch/v1":
        raise ConfigError(f"Job template must use apiVersion batch/v1, got {job['apiVersion']!r}")
    pod_spec = _mapping(_mapping(_mapping(job, "spec"), "template"), "spec")
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise ConfigError("Job template has no containers (spec.template.spec.containers)")
    return job


def _mapping(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise ConfigError(f"Job template: {key} must be a mapping, got {type(value).__name__}")
    return value


def _inject_env(container: dict[str, Any], env: Mapping[str, str]) -> None:
    current = container.get("env") or []
    if not isinstance(current, list):
        raise ConfigError(f"Job template: env of container {container.get('name')!r} must be a list")
    kept = [item for item in current if not (isinstance(item, dict) and item.get("name") in env)]
    container["env"] = kept + [{"name": name, "value": value} for name, value in env.items()]


def render_job(
    template: str,
    *,
    input_value: Any,
    rollout_id: str,
    attempt_id: str,
    namespace: str,
    env: Mapping[str, str],
    timeout_seconds: float,
    ttl_seconds_after_finished: int,
    controller_id: str = "",
    is_train: bool = True,
) -> dict[str, Any]:
    """The Job manifest for one attempt, ready for create_namespaced_job. Raises ConfigError when unusable."""
    context = {"input": input_value, "rollout_id": rollout_id, "attempt_id": attempt_id, "is_train": is_train}
    job = parse_job(render_text(template, context))
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        ROLLOUT_LABEL: label_value(rollout_id),
        ATTEMPT_LABEL: label_value(attempt_id),
    }
    metadata = _mapping(job, "metadata")
    metadata.pop("generateName", None)
    metadata["name"] = job_name(rollout_id)
    metadata["namespace"] = namespace
    metadata["labels"] = {**(_mapping(metadata, "labels")), **labels}
    annotations = {ROLLOUT_ANNOTATION: rollout_id, ATTEMPT_ANNOTATION: attempt_id}
    if controller_id:
        annotations[CONTROLLER_ANNOTATION] = controller_id
    metadata["annotations"] = {**(_mapping(metadata, "annotations")), **annotations}

    spec = job["spec"]
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout_seconds))
    spec["ttlSecondsAfterFinished"] = ttl_seconds_after_finished
    pod_template = spec["template"]
    pod_metadata = _mapping(pod_template, "metadata")
    pod_metadata["labels"] = {**(_mapping(pod_metadata, "labels")), **labels}
    pod_spec = pod_template["spec"]
    pod_spec["restartPolicy"] = "Never"
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            if not isinstance(container, dict):
                raise ConfigError(f"Job template: every entry of {key} must be a mapping")
            _inject_env(container, env)
    return job
