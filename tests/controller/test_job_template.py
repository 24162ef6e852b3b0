"""render_job and its helpers: pure functions, no cluster."""

from __future__ import annotations

import re

import pytest
import yaml

from services.controller.core.outcome import ConfigError
from services.controller.k8s.job_template import job_name, label_value, render_job, yaml_escape

# The shape of Agent Lightning's upstream example: the input reaches the container through yaml_escape.
UPSTREAM_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: ignored-{{ rollout_id }}
  labels:
    team: rl
spec:
  backoffLimit: 6
  activeDeadlineSeconds: 99999
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: agent
          image: python:3.11-slim
          command: ["python", "-m", "my_agent"]
          env:
            - name: QUESTION
              value: {{ input.question | yaml_escape }}
            - name: AGL_KEY
              value: "a value the controller must replace"
            - name: KEEP
              value: "kept"
        - name: sidecar
          image: busybox
"""

ENV = {"AGL_OPENAI_BASE_URL": "http://p/x", "AGL_EVENT_URL": "http://p/e", "AGL_KEY": "tok"}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def render(template: str = UPSTREAM_TEMPLATE, input_value: object = None, **kwargs: object) -> dict:
    args = dict(
        input_value={"question": "What is 2+2?"} if input_value is None else input_value,
        rollout_id="ro-123",
        attempt_id="att-1",
        namespace="agents",
        env=ENV,
        timeout_seconds=12.5,
        ttl_seconds_after_finished=300,
        controller_id="ctl-a",
    )
    args.update(kwargs)
    return render_job(template, **args)  # type: ignore[arg-type]


def test_forced_fields_override_the_template() -> None:
    job = render()
    assert job["metadata"]["name"] == job_name("ro-123")
    assert job["metadata"]["namespace"] == "agents"
    labels = job["metadata"]["labels"]
    assert labels["team"] == "rl"
    assert labels["app.kubernetes.io/managed-by"] == "agl-controller"
    assert labels["agl.io/rollout-id"] == "ro-123"
    assert labels["agl.io/attempt-id"] == "att-1"
    assert job["metadata"]["annotations"]["agl.io/controller-id"] == "ctl-a"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 13
    assert job["spec"]["ttlSecondsAfterFinished"] == 300
    pod = job["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"]["agl.io/rollout-id"] == "ro-123"


def test_agent_variables_injected_into_every_container_replacing_same_names() -> None:
    containers = render()["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent", "sidecar"]
    for container in containers:
        env = container["env"]
        names = [item["name"] for item in env]
        assert names.count("AGL_KEY") == 1
        assert {item["name"]: item["value"] for item in env if item["name"] in ENV} == ENV
    agent_env = {item["name"]: item["value"] for item in containers[0]["env"]}
    assert agent_env["QUESTION"] == "What is 2+2?"
    assert agent_env["KEEP"] == "kept"


@pytest.mark.parametrize(
    "question",
    [
        'He said "hi": yes # not a comment',
        "multi\nline\n  indented\ttab",
        "- looks: [like, yaml]\n---\nkind: Pod",
        "unicode é 中文 😀 \u2028 \x85 \x00 \x7f \ufeff",
        "{{ not a template }}",
        "",
        "null",
        "123",
    ],
)
def test_yaml_escape_round_trips_hostile_strings(question: str) -> None:
    job = render(input_value={"question": question})
    agent_env = {item["name"]: item["value"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert agent_env["QUESTION"] == question


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -7, 3.25, 1e20, 1e-5, "x", [1, "two", None, {"a": [True]}], {"k": "v:w", "n": 2.0}],
)
def test_yaml_escape_any_json_value(value: object) -> None:
    assert yaml.safe_load(f"key: {yaml_escape(value)}\n") == {"key": value}


def test_missing_input_field_is_an_error_not_an_empty_string() -> None:
    with pytest.raises(ConfigError, match="question"):
        render(input_value={"other": 1})


def test_template_errors_become_config_errors() -> None:
    with pytest.raises(ConfigError, match="syntax error"):
        render("kind: Job\n{% if %}")
    with pytest.raises(ConfigError, match="exactly one YAML document, got 2"):
        render(UPSTREAM_TEMPLATE + "---\n" + UPSTREAM_TEMPLATE)
    with pytest.raises(ConfigError, match="exactly one YAML document, got 0"):
        render("# nothing\n")
    with pytest.raises(ConfigError, match="kind Job, got 'Pod'"):
        render(UPSTREAM_TEMPLATE.replace("kind: Job", "kind: Pod"))
    with pytest.raises(ConfigError, match="apiVersion batch/v1"):
        render(UPSTREAM_TEMPLATE.replace("apiVersion: batch/v1", "apiVersion: v1"))
    with pytest.raises(ConfigError, match="no containers"):
        render("kind: Job\nspec:\n  template:\n    spec: {}\n")
    with pytest.raises(ConfigError, match="valid YAML"):
        render("kind: Job\nspec: [unclosed\n")


def test_sandbox_blocks_unsafe_attribute_access() -> None:
    with pytest.raises(ConfigError, match="invalid Job template"):
        render("kind: Job\nx: {{ input.__class__.__mro__[1].__subclasses__() }}\n")


def test_job_names_are_deterministic_valid_and_distinct() -> None:
    ids = ["ro-123", "RO-123", "a" * 300, "ünïcødé/../x", "---", "", "ro-123 ", "f7c1c8a0-9b1e-4f8e-9d62-3f5ad2e1c0aa"]
    names = [job_name(rollout_id) for rollout_id in ids]
    assert names == [job_name(rollout_id) for rollout_id in ids]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= 63
        assert DNS_LABEL.fullmatch(name), name


def test_label_values_are_valid() -> None:
    assert label_value("ro-123") == "ro-123"
    for raw in ["x" * 64, "has space", "-leading", "trailing.", "ünï", "a/b:c", "_"]:
        value = label_value(raw)
        assert len(value) <= 63
        assert LABEL_VALUE.fullmatch(value), value
    assert label_value("x" * 64) != label_value("x" * 65)
