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

from ..core.outcome import ConfigError

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


def job_name(rollout_id: str, attempt_number: int = 1) -> str:
    """Deterministic DNS-1123 label (<= 63 chars) for the Job of the rollout's attempt: readable stem plus a short
    hash; attempts after the first get their number (`-a2`), so a retry never collides with an earlier Job."""
    key = rollout_id if attempt_number <= 1 else f"{rollout_id}#{attempt_number}"
    suffix = "" if attempt_number <= 1 else f"-a{attempt_number}"
    room = 63 - len(_NAME_PREFIX) - 1 - _HASH_LEN - len(suffix)
    stem = re.sub(r"[^a-z0-9]+", "-", rollout_id.lower()).strip("-")[:room].strip("-")
    stem = f"{stem}{suffix}" if stem else suffix.lstrip("-")
    return f"{_NAME_PREFIX}{stem}-{_digest(key)}" if stem else f"{_NAME_PREFIX}{_digest(key)}"


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

# Most bytes a rendered template may have; also bounds what one `*` or `+` in it may build.
MAX_OUTPUT_BYTES = 1 << 20
# Largest integer (in bits) one arithmetic operation may produce: 10**10000000 has 33 million bits.
MAX_INT_BITS = 4096


class LimitedSandbox(SandboxedEnvironment):
    """Jinja2's sandbox, plus arithmetic that cannot explode: `**`, `*` and `+` whose result would be an integer
    over MAX_INT_BITS or a string or list over MAX_OUTPUT_BYTES are refused before they are computed (and so are
    never folded at compile time either)."""

    intercepted_binops = frozenset({"**", "*", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            _check_power(left, right)
        elif operator == "*":
            _check_product(left, right)
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _check_size(len(left) + len(right), f"{operator} of sequences")
        return super().call_binop(context, operator, left, right)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_power(base: Any, exponent: Any) -> None:
    if (
        _is_int(base)
        and _is_int(exponent)
        and exponent > 0
        and abs(base) > 1
        and exponent * math.log2(abs(base)) > MAX_INT_BITS
    ):
        raise jinja2.exceptions.SecurityError(
            f"{base} ** {exponent} would exceed {MAX_INT_BITS} bits: refused in a Job template"
        )


def _check_product(left: Any, right: Any) -> None:
    if _is_int(left) and _is_int(right):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise jinja2.exceptions.SecurityError(f"a product over {MAX_INT_BITS} bits is refused in a Job template")
        return
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and _is_int(times):
            _check_size(len(seq) * max(times, 0), "repetition")


def _check_size(size: int, what: str) -> None:
    if size > MAX_OUTPUT_BYTES:
        raise jinja2.exceptions.SecurityError(
            f"{what} of {size} items is over the {MAX_OUTPUT_BYTES}-byte output limit: refused in a Job template"
        )


_ENV = LimitedSandbox(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
_ENV.filters["yaml_escape"] = yaml_escape


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> jinja2.Template:
    return _ENV.from_string(template)


def render_text(template: str, context: Mapping[str, Any], max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """The template rendered with `context`, at most `max_bytes` of it (UTF-8 bytes, as the API server gets it, not
    characters); any template error becomes ConfigError."""
    try:
        parts: list[str] = []
        size = 0
        for part in _compile(template).generate(**context):
            size += len(part) if part.isascii() else len(part.encode("utf-8", "surrogatepass"))
            if size > max_bytes:
                raise ConfigError(f"invalid Job template: it renders to more than {max_bytes} bytes (the limit)")
            parts.append(part)
        return "".join(parts)
    except ConfigError:
        raise
    except jinja2.exceptions.SecurityError as err:
        raise ConfigError(f"invalid Job template: {err}") from err
    except MemoryError as err:
        raise ConfigError("invalid Job template: rendering it ran out of memory (the render limit)") from err
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
    attempt_number: int = 1,
    max_bytes: int = MAX_OUTPUT_BYTES,
) -> dict[str, Any]:
    """The Job manifest for one attempt, ready for create_namespaced_job. Raises ConfigError when unusable.

    Pure but unbounded in time and memory for a hostile template: the controller runs it in a render worker
    (`template_worker`) with limits, never in its event loop."""
    context = {"input": input_value, "rollout_id": rollout_id, "attempt_id": attempt_id, "is_train": is_train}
    job = parse_job(render_text(template, context, max_bytes))
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        ROLLOUT_LABEL: label_value(rollout_id),
        ATTEMPT_LABEL: label_value(attempt_id),
    }
    metadata = _mapping(job, "metadata")
    metadata.pop("generateName", None)
    metadata["name"] = job_name(rollout_id, attempt_number)
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
