"""Agent Lightning v1.0's REST bodies <-> the ledger's messages (pure; the gRPC contract is the source of truth).

v1.0 names: `status.k8s_job_name` is the rollout's launcher_ref, `status.last_attempt_id` its attempt_id,
`created_at`/`updated_at` are seconds since the epoch, rollout metadata is free JSON (kept whole in
metadata.data_json, and its scalar values also as labels, so the ledger can filter on them), and events carry
their payload as `data`. Bad bodies raise ShapeError, answered 422 as v1.0 (FastAPI) does.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import orjson

from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.proxy.call.rewrite import loads_lenient

STATE_NAMES = {
    rollout_pb2.ROLLOUT_STATE_QUEUING: "queuing",
    rollout_pb2.ROLLOUT_STATE_RUNNING: "running",
    rollout_pb2.ROLLOUT_STATE_SUCCEEDED: "succeeded",
    rollout_pb2.ROLLOUT_STATE_FAILED: "failed",
}
STATES = {name: state for state, name in STATE_NAMES.items()}
DEFAULT_ATTEMPT_ID = "0"  # v1.0's only attempt id
DEFAULT_TIMEOUT_S = 3600  # v1.0's RolloutConfig default
_STATUS_NAMES = {
    event_pb2.MODEL_REQUEST_STATUS_OK: "ok",
    event_pb2.MODEL_REQUEST_STATUS_ERROR: "error",
    event_pb2.MODEL_REQUEST_STATUS_INCOMPLETE: "incomplete",
}
_PATCH_FIELDS = frozenset({"state", "k8s_job_name", "last_attempt_id", "error_message"})


class ShapeError(ValueError):
    """A request body v1.0 would refuse with 422."""


def _json_text(value: Any, where: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as err:
        raise ShapeError(f"{where} cannot be stored as JSON: {err}") from None


def _loads(text: str) -> Any:
    if not text:
        return None
    try:
        return loads_lenient(text.encode())
    except ValueError:
        return text


def _seconds(stamp: Any) -> float:
    return stamp.seconds + stamp.nanos / 1e9


def _number(value: float) -> int | float:
    return int(value) if math.isfinite(value) and value == int(value) else value


def _label(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


# -- rollouts ------------------------------------------------------------------------------------------------------


def rollout_spec(item: Any, index: int) -> rollout_pb2.RolloutSpec:
    """One RolloutCreate of a POST /api/rollouts body."""
    where = f"body[{index}]"
    if not isinstance(item, dict):
        raise ShapeError(f"{where} must be an object.")
    if "input" not in item:
        raise ShapeError(f"{where}.input is required.")
    spec = rollout_pb2.RolloutSpec(input_json=_json_text(item["input"], f"{where}.input"))
    rollout_id = item.get("rollout_id")
    if rollout_id is None:
        rollout_id = uuid.uuid4().hex  # v1.0's id for a rollout created without one
    if not isinstance(rollout_id, str):
        raise ShapeError(f"{where}.rollout_id must be a string.")
    spec.rollout_id = rollout_id
    is_train = item.get("is_train", True)
    if not isinstance(is_train, bool):
        raise ShapeError(f"{where}.is_train must be a boolean.")
    spec.is_train = is_train
    _config(spec.config, item.get("config"), f"{where}.config")
    metadata = item.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise ShapeError(f"{where}.metadata must be an object.")
        spec.metadata.data_json = _json_text(metadata, f"{where}.metadata")
        for key, value in metadata.items():
            label = _label(value)
            if label is not None:
                spec.metadata.labels[key] = label
    return spec


def _config(config: rollout_pb2.RolloutConfig, value: Any, where: str) -> None:
    value = value if value is not None else {}
    if not isinstance(value, dict):
        raise ShapeError(f"{where} must be an object.")
    timeout = value.get("timeout_seconds", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout < 0:
        raise ShapeError(f"{where}.timeout_seconds must be a non-negative number.")
    config.timeout_seconds = timeout
    local = value.get("local")
    if local is not None:
        if not isinstance(local, dict):
            raise ShapeError(f"{where}.local must be an object.")
        config.local.SetInParent()
        if local.get("agent_class") is not None:
            if not isinstance(local["agent_class"], str):
                raise ShapeError(f"{where}.local.agent_class must be a string.")
            config.local.agent_class = local["agent_class"]
        env_map = local.get("env_map") or {}
        if not isinstance(env_map, dict) or not all(isinstance(v, str) for v in env_map.values()):
            raise ShapeError(f"{where}.local.env_map must map names to strings.")
        config.local.env_map.update(env_map)
        command = local.get("command")
        if command is not None:
            if not isinstance(command, list) or not all(isinstance(arg, str) for arg in command):
                raise ShapeError(f"{where}.local.command must be a list of strings.")
            config.local.command.extend(command)
    k8s = value.get("k8s")
    if k8s is not None:
        if not isinstance(k8s, dict):
            raise ShapeError(f"{where}.k8s must be an object.")
        config.k8s.SetInParent()
        template = k8s.get("job_template")
        if template is not None:
            if not isinstance(template, str):
                raise ShapeError(f"{where}.k8s.job_template must be a string.")
            config.k8s.job_template = template


def rollout_json(rollout: rollout_pb2.Rollout) -> dict[str, Any]:
    config = rollout.config
    local = None
    if config.HasField("local"):
        local = {"agent_class": config.local.agent_class or None, "env_map": dict(config.local.env_map)}
        if config.local.command:
            local["command"] = list(config.local.command)
    k8s = {"job_template": config.k8s.job_template or None} if config.HasField("k8s") else None
    metadata: dict[str, Any] = {"batch_idx": None, "sample_idx_in_batch": None, **rollout.metadata.labels}
    stored = _loads(rollout.metadata.data_json)
    if isinstance(stored, dict):
        metadata.update(stored)
    status = rollout.status
    return {
        "rollout_id": rollout.rollout_id,
        "input": _loads(rollout.input_json),
        "is_train": rollout.is_train,
        "config": {"timeout_seconds": _number(config.timeout_seconds), "local": local, "k8s": k8s},
        "metadata": metadata,
        "status": {
            "state": STATE_NAMES.get(status.state, "queuing"),
            "k8s_job_name": status.launcher_ref or None,
            "last_attempt_id": status.attempt_id or None,
            "error_message": status.error_message or None,
            "version": status.version,
            "created_at": _seconds(status.create_time),
            "updated_at": _seconds(status.update_time),
        },
    }


def data_id(rollout: rollout_pb2.Rollout) -> str:
    """v1.0's grouping id of a rollout: its input's data_id or instance_id."""
    value = _loads(rollout.input_json)
    if isinstance(value, dict):
        return str(value.get("data_id") or value.get("instance_id") or "")
    return ""


def terminal_item(rollout: rollout_pb2.Rollout) -> dict[str, Any]:
    return {
        "rollout_id": rollout.rollout_id,
        "state": STATE_NAMES.get(rollout.status.state, ""),
        "data_id": data_id(rollout),
        "is_train": rollout.is_train,
    }


# v1.0's transition table (its schemas.VALID_TRANSITIONS) and AGL's one addition, running -> running (a running
# attempt's fields change along it). The ledger enforces its own table; this one gives v1.0's words first.
_TRANSITIONS = {
    rollout_pb2.ROLLOUT_STATE_QUEUING: {rollout_pb2.ROLLOUT_STATE_RUNNING, rollout_pb2.ROLLOUT_STATE_FAILED},
    rollout_pb2.ROLLOUT_STATE_RUNNING: {
        rollout_pb2.ROLLOUT_STATE_RUNNING,
        rollout_pb2.ROLLOUT_STATE_SUCCEEDED,
        rollout_pb2.ROLLOUT_STATE_FAILED,
    },
}


def transition_refusal(rollout_id: str, current: int, target: int) -> str | None:
    """v1.0's 409 detail for a transition it refuses, or None when the move is allowed."""
    if target in _TRANSITIONS.get(current, ()):
        return None
    return f"Rollout {rollout_id}: cannot transition {STATE_NAMES.get(current)} -> {STATE_NAMES.get(target)}"


def status_patch(body: Any) -> dict[str, Any]:
    """The `status` fields of a PATCH /api/rollouts/{id} body (extra fields are refused, as in v1.0)."""
    if not isinstance(body, dict) or set(body) - {"status"}:
        raise ShapeError("The body must be an object with `status` only.")
    status = body.get("status")
    if status is None:
        return {}
    if not isinstance(status, dict):
        raise ShapeError("`status` must be an object.")
    extra = set(status) - _PATCH_FIELDS
    if extra:
        raise ShapeError(f"`status` has fields that cannot be patched: {', '.join(sorted(extra))}.")
    patch = {k: v for k, v in status.items() if v is not None}
    for name, value in patch.items():
        if not isinstance(value, str):
            raise ShapeError(f"`status.{name}` must be a string.")
    if "state" in patch and patch["state"] not in STATES:
        raise ShapeError(f"`status.state` must be one of {', '.join(STATES)}, not {patch['state']!r}.")
    return patch


# -- events --------------------------------------------------------------------------------------------------------


def _model_request(request: event_pb2.ModelRequest, triplet: bool) -> dict[str, Any]:
    logprobs = list(request.response_logprobs) if request.has_response_logprobs else None
    data: dict[str, Any] = {
        "prompt_token_ids": list(request.prompt_token_ids),
        "response_token_ids": list(request.response_token_ids),
        "response_log_probs": logprobs,
        "server": {"model": request.model, "version": request.model_version},
        "status": _STATUS_NAMES.get(request.status, "error"),
        "finish_reason": request.finish_reason or None,
    }
    if triplet:  # the shape v1.0's trainer reads (the stored triplet form also keeps the HTTP status, for AGL's)
        return data
    if request.http_status:
        data["http_status"] = request.http_status
    data["server"]["endpoint"] = request.endpoint
    usage = request.usage
    data.update(
        model=request.model,
        model_version=request.model_version,
        request=_loads(request.request_json),
        response=_loads(request.response_json),
        latency_ms=request.latency_seconds * 1000,
        retry_count=request.retry_count,
        usage={
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
        if request.HasField("usage")
        else None,
        api=request.api,
        stream=request.stream,
    )
    return data


def _reward(reward: event_pb2.Reward, triplet: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"value": reward.value if reward.HasField("value") else None}
    names = ("source", "reason") if triplet else ("message", "source", "reason")
    for name in names:
        if getattr(reward, name):
            data[name] = getattr(reward, name)
    extra = _loads(reward.data_json)
    if not triplet and isinstance(extra, dict):
        data.update({k: v for k, v in extra.items() if k not in data})
    return data


def event_json(event: event_pb2.Event, triplet: bool = False) -> dict[str, Any]:
    payload = event.WhichOneof("payload")
    if payload == "model_request":
        data: Any = _model_request(event.model_request, triplet)
    elif payload == "reward":
        data = _reward(event.reward, triplet)
    elif payload == "data_json":
        data = _loads(event.data_json)
    else:
        data = {}
    return {
        "event_type": event.event_type,
        "rollout_id": event.rollout_id,
        "attempt_id": event.attempt_id or DEFAULT_ATTEMPT_ID,  # filed under no attempt: v1.0's "0"
        "timestamp": _seconds(event.create_time),
        "data": data if data is not None else {},
    }


# -- models --------------------------------------------------------------------------------------------------------


def model_endpoint(item: Any, index: int) -> model_pb2.ModelEndpoint:
    where = f"body[{index}]"
    if not isinstance(item, dict):
        raise ShapeError(f"{where} must be an object.")
    model, endpoint, version = item.get("model"), item.get("endpoint"), item.get("version", 0)
    if not isinstance(model, str) or not model or not isinstance(endpoint, str) or not endpoint:
        raise ShapeError(f"{where} needs `model` and `endpoint`, non-empty strings.")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ShapeError(f"{where}.version must be an integer.")
    return model_pb2.ModelEndpoint(model_name=model, endpoint=endpoint, version=version)


def model_json(endpoint: model_pb2.ModelEndpoint) -> dict[str, Any]:
    return {"model": endpoint.model_name, "endpoint": endpoint.endpoint, "version": endpoint.version}
