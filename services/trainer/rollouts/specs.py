"""Rollout specs the trainer creates: deterministic ids, labels and the launch config. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services import role_map
from services._gen.agl.v1 import rollout_pb2

LABEL_RUN = "agl_run"
LABEL_STEP = "agl_step"
LABEL_GROUP = "agl_group"
LABEL_DATA_ID = "agl_data_id"
# The model the rollout's calls go to: the proxies route by it (services/proxy/engines/model_tables.py MODEL_LABEL).
LABEL_MODEL = "agl_model"

# Backoff of the infrastructure retries: 0.5 s before attempt 2, doubling, at most 8 s.
RETRY_BACKOFF_S = 0.5
RETRY_MAX_BACKOFF_S = 8.0

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class LaunchSettings:
    """How the controller runs each rollout (copied into RolloutConfig)."""

    timeout_seconds: float = 0.0
    agent_class: str = ""
    command: tuple[str, ...] = ()
    env_map: Mapping[str, str] = field(default_factory=dict)
    # Jinja2 Job template text (read from agl.launch.k8s_job_template_file at start-up).
    k8s_job_template: str = ""
    # The ledger's retry policy: attempts of each rollout (1: none) for the FailureReason values in retry_on
    # (agl.infra_failures: the infrastructure's reasons), RETRY_BACKOFF_S before the second attempt.
    retry_attempts: int = 1
    retry_on: tuple[int, ...] = ()
    # The model the run trains (agl.model_name; a LoRA run's adapter name): each rollout is labelled with it, and
    # the proxies send its calls to that model's engines. "": no label, the proxies' own model.
    model_name: str = ""
    # The run's role map as its label (agl.roles; services/role_map.py): the proxies route each call by the model
    # name it sends. "": none, every call goes to model_name.
    roles: str = ""

    def to_proto(self) -> rollout_pb2.RolloutConfig:
        config = rollout_pb2.RolloutConfig(timeout_seconds=self.timeout_seconds)
        if self.retry_attempts > 1:
            config.retry.CopyFrom(
                rollout_pb2.RetryPolicy(
                    max_attempts=self.retry_attempts,
                    retry_on=list(self.retry_on),
                    initial_backoff_seconds=RETRY_BACKOFF_S,
                    max_backoff_seconds=RETRY_MAX_BACKOFF_S,
                )
            )
        if self.agent_class or self.command or self.env_map:
            config.local.agent_class = self.agent_class
            config.local.command.extend(self.command)
            config.local.env_map.update(dict(self.env_map))
        if self.k8s_job_template:
            config.k8s.job_template = self.k8s_job_template
        return config


@dataclass(frozen=True)
class Sample:
    """One dataset item: its id (stable across epochs) and the agent input (any JSON value)."""

    data_id: str
    input: Any


def check_run_id(run_id: str) -> str:
    """Run ids become part of rollout ids, which appear in URLs: keep them to [A-Za-z0-9_.-]."""
    if not _SAFE.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {_SAFE.pattern}")
    return run_id


def group_id(run_id: str, step: int, slot: int, kind: str = "s") -> str:
    """Group of the slot-th sample enqueued at a step; kind "s" for training, "v" for validation."""
    return f"{run_id}-{kind}{step}-g{slot}"


def rollout_id(run_id: str, step: int, slot: int, index: int, kind: str = "s") -> str:
    """The index-th of the n rollouts of a group; deterministic so that creating it again is a no-op."""
    return f"{group_id(run_id, step, slot, kind)}-r{index}"


def build_specs(
    *,
    run_id: str,
    step: int,
    slot: int,
    sample: Sample,
    n: int,
    launch: LaunchSettings,
    is_train: bool = True,
    kind: str = "s",
) -> list[rollout_pb2.RolloutSpec]:
    """The n sibling specs of one group."""
    group = group_id(run_id, step, slot, kind)
    labels = {LABEL_RUN: run_id, LABEL_STEP: str(step), LABEL_GROUP: group, LABEL_DATA_ID: sample.data_id}
    if launch.model_name:
        labels[LABEL_MODEL] = launch.model_name
    if launch.roles:
        labels[role_map.LABEL_ROLES] = launch.roles
    input_json = json.dumps(sample.input, separators=(",", ":"))
    config = launch.to_proto()
    return [
        rollout_pb2.RolloutSpec(
            rollout_id=rollout_id(run_id, step, slot, i, kind),
            input_json=input_json,
            is_train=is_train,
            config=config,
            metadata=rollout_pb2.RolloutMetadata(labels=labels),
        )
        for i in range(n)
    ]
