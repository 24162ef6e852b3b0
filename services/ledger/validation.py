"""Request validation shared by the core: JSON text fields, rollout specs and events."""

from __future__ import annotations

import json
import re

import orjson

from services import role_map
from services._gen.agl.v1 import event_pb2, rollout_pb2

from .attempts import check_policy
from .errors import InvalidArgument

MAX_ID_LENGTH = 256
# Rollout and attempt ids appear in URL paths (AGL_OPENAI_BASE_URL, AGL_EVENT_URL), Job names and log lines, so
# they are kept to characters that need no escaping anywhere: letters, digits, `_`, `.` and `-`, starting with a
# letter, digit or `_` (so neither `.`, `..` nor a flag-like `-x`). uuid hex ids and the trainer's and demo's
# `run-s1-g0-r3` shapes fit.
ID_CHARACTERS = "letters, digits, '_', '.' and '-', starting with a letter, digit or '_'"
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MODEL_REQUEST = "model_request"
REWARD = "reward"


def check_json(text: str, field: str, where: str) -> None:
    """Raise InvalidArgument naming `field` unless `text` is empty or valid JSON."""
    if not text:
        return
    try:
        orjson.loads(text)  # the fast check; strict RFC 8259
    except orjson.JSONDecodeError:
        try:
            json.loads(text)  # what it refuses and json accepts (NaN, lone surrogates) stays accepted
        except ValueError as exc:
            raise InvalidArgument(f"{where}: {field} is not valid JSON: {exc}") from None
        except RecursionError:
            raise InvalidArgument(f"{where}: {field} is nested too deeply (at most 1,024 levels)") from None


def check_id(value: str, field: str, where: str) -> None:
    """A caller-chosen id (event ids): at most MAX_ID_LENGTH characters."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{where}: {field} is longer than {MAX_ID_LENGTH} characters")


def check_safe_id(value: str, field: str, where: str) -> None:
    """A rollout or attempt id (empty allowed: the ledger or the rollout fills it): ID_CHARACTERS only."""
    if not value:
        return
    check_id(value, field, where)
    if _SAFE_ID.fullmatch(value) is None:
        raise InvalidArgument(f"{where}: {field} {value!r} has characters outside the id set ({ID_CHARACTERS})")


def check_spec(spec: rollout_pb2.RolloutSpec, index: int) -> None:
    where = f"rollouts[{index}]"
    check_safe_id(spec.rollout_id, "rollout_id", where)
    if spec.rollout_id:
        where = f"rollouts[{index}] ({spec.rollout_id})"
    check_json(spec.input_json, "input_json", where)
    check_json(spec.metadata.data_json, "metadata.data_json", where)
    if spec.config.timeout_seconds < 0:
        raise InvalidArgument(f"{where}: config.timeout_seconds must not be negative")
    check_policy(spec.config.retry, where)
    roles = spec.metadata.labels.get(role_map.LABEL_ROLES)
    if roles is not None:
        # Refused here, whole, rather than call by call at the proxy once the rollout's agent runs.
        try:
            role_map.from_label(roles)
        except role_map.RoleMapError as err:
            raise InvalidArgument(f"{where}: metadata.labels[{role_map.LABEL_ROLES!r}]: {err}") from None


def check_event(event: event_pb2.Event, index: int) -> None:
    """Validate one event of an append and fill an empty event_type from its payload."""
    where = f"events[{index}]"
    if not event.rollout_id:
        raise InvalidArgument(f"{where}: rollout_id is required")
    where = f"events[{index}] (rollout {event.rollout_id})"
    check_id(event.event_id, "event_id", where)
    # rollout_id and attempt_id need no character check here: the rollout must exist and the attempt must be its
    # current one (Ledger.stage_events), and both were checked when they were set.
    payload = event.WhichOneof("payload")
    if not event.event_type:
        if payload == "model_request":
            event.event_type = MODEL_REQUEST
        elif payload == "reward":
            event.event_type = REWARD
        else:
            raise InvalidArgument(f"{where}: event_type is required")
    if payload == "model_request":
        mr = event.model_request
        check_json(mr.request_json, "model_request.request_json", where)
        check_json(mr.response_json, "model_request.response_json", where)
    elif payload == "reward":
        if not event.reward.HasField("value"):
            raise InvalidArgument(f"{where}: reward.value is required")
        check_json(event.reward.data_json, "reward.data_json", where)
    elif payload == "data_json":
        check_json(event.data_json, "data_json", where)
    if event.event_type == REWARD and payload != "reward":
        raise InvalidArgument(f"{where}: a reward event needs the reward payload with reward.value")
