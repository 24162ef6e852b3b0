"""v1.0's Kubernetes controller (`agl-controller runner_type=k8s`, kr8s), unchanged, against AGL's REST routes and
the Kubernetes API stand-in (tests/controller/k8s_standin.py), which grants it AGL's own controller Role.

v1.0's reconciler creates each rollout's Job from calc_x's own Job template, claims the rollout once its Job exists,
and ends it from the Job's status (its watch, and its periodic reconcile). The test plays the kubelet for the Job it
lets run: it starts the Job's container command with the container's environment, as calc_x's image would (`/app` is
the example's folder there), and reports the container's exit as the Job's end. What v1.0's controller did is read
back from AGL over HTTP and from the stand-in's record of the requests.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.controller.k8s_standin import K8sStandin
from tests.support.procs import REPO_ROOT, ServiceProcess, start_service

from .conftest import KEY, Agl1, Stack, http, registered_stack

NAMESPACE = "default"
RBAC = REPO_ROOT / "deploy" / "k8s" / "controller-rbac.yaml"


@pytest.fixture
def k8s() -> Iterator[K8sStandin]:
    """The stand-in API server, with the Role AGL's controller runs under (deploy/k8s/controller-rbac.yaml)."""
    [role] = [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc["kind"] == "Role"]
    with K8sStandin(rbac_rules=role["rules"]) as standin:
        yield standin


@contextlib.contextmanager
def v1_k8s_controller(agl1: Agl1, stack: Stack, k8s: K8sStandin, tmp_path: Path) -> Iterator[ServiceProcess]:
    """v1.0's controller with its Kubernetes runner (its console script), pointed at the proxy with the master key
    and, through a kubeconfig, at the stand-in."""
    kubeconfig = k8s.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
    argv = [str(agl1.bin / "agl-controller"), "runner_type=k8s", f"agl_server.url={stack.proxy.url}"]
    argv += [f"agl_server.key={KEY}", f"k8s_runner.namespace={NAMESPACE}", "k8s_runner.poll_interval=0.5"]
    argv += [f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    env = {**agl1.env(), "KUBECONFIG": str(kubeconfig)}
    with start_service(argv, name="v1-k8s-controller", env=env, log_dir=tmp_path) as process:
        time.sleep(0.5)
        assert process.alive(), process.log_text()
        yield process


def rollout(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    reply = client.get(f"/api/rollouts/{rollout_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()["rollout"]


def wait_state(
    client: httpx.Client, rollout_id: str, state: str, controller: ServiceProcess, timeout_s: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (current := rollout(client, rollout_id))["status"]["state"] != state:
        assert time.monotonic() < deadline, (current, controller.log_text()[-4000:])
        assert controller.alive(), controller.log_text()[-4000:]
        time.sleep(0.2)
    return current


def run_pod(agl1: Agl1, job: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The Job's one container as calc_x's image runs it: its command, with /app the example's folder, and its env."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    app = str(agl1.examples / "calc_x")
    command = [part.replace("/app", app) for part in container["command"]]
    assert command[0] == "python"
    command[0] = str(agl1.python)
    env = {"PATH": os.pathsep.join([str(agl1.bin), os.environ.get("PATH", "")]), "HOME": os.environ.get("HOME", "/")}
    env |= {item["name"]: item["value"] for item in container["env"]}
    return subprocess.run(command, env=env, cwd=app, capture_output=True, text=True, timeout=180)


def test_v1_k8s_controller_runs_rollouts_to_the_end_through_agl(
    agl1: Agl1, stack: Stack, k8s: K8sStandin, tmp_path: Path
) -> None:
    registered_stack(stack)
    template = (agl1.examples / "calc_x" / "job-template.yaml").read_text()
    questions = {
        "ran": {"question": "What is 12 * 7?", "result": "84"},
        "failed": {"question": "What is 3 + 4?", "result": "7"},
        "vanished": {"question": "What is 9 - 2?", "result": "7"},
    }
    ids = {name: uuid.uuid4().hex for name in questions}
    body = [
        {
            "rollout_id": ids[name],
            "input": question,
            "is_train": name == "ran",
            "config": {"timeout_seconds": 120, "k8s": {"job_template": template}},
        }
        for name, question in questions.items()
    ]
    jobs = {name: f"agl-rollout-{rollout_id}" for name, rollout_id in ids.items()}
    with v1_k8s_controller(agl1, stack, k8s, tmp_path) as controller, http(stack) as client:
        assert client.post("/api/rollouts", json=body).status_code == 201
        # Its reconcile creates one Job per queued rollout, then claims the rollout for it: attempt "0", the Job's
        # name as the rollout's handle.
        running = {name: wait_state(client, rollout_id, "running", controller) for name, rollout_id in ids.items()}
        for name, current in running.items():
            assert current["status"]["k8s_job_name"] == jobs[name]
            assert current["status"]["last_attempt_id"] == "0"
        assert sorted(k8s.created) == sorted(jobs.values())

        # The Job v1.0 rendered: calc_x's template, its labels and the agent's variables pointing at AGL.
        job = k8s.job(NAMESPACE, jobs["ran"])
        assert job is not None
        labels = job["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "agentlightning"
        assert labels["agentlightning/rollout-id"] == ids["ran"]
        assert labels["agentlightning/attempt-id"] == "0"
        assert job["spec"]["activeDeadlineSeconds"] == 120 and job["spec"]["backoffLimit"] == 0
        env = {item["name"]: item["value"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        prefix = f"{stack.proxy.url}/proxy/rollout/{ids['ran']}/attempt/0"
        assert env["AGL_OPENAI_BASE_URL"] == f"{prefix}/mode/train/openai/v1"
        assert env["AGL_EVENT_URL"] == f"{stack.proxy.url}/api/rollouts/{ids['ran']}/attempt/0/events"
        assert env["AGL_KEY"] == KEY  # v1.0 hands its pods the master key (AGL's controller mints per-attempt tokens)
        assert env["QUESTION"] == questions["ran"]["question"] and env["RESULT"] == "84"

        # The pod runs calc_x's agent against AGL's proxy; its exit ends the Job, and the Job's end the rollout.
        pod = run_pod(agl1, job)
        assert pod.returncode == 0, pod.stdout[-3000:] + pod.stderr[-3000:]
        k8s.complete_job(NAMESPACE, jobs["ran"])
        k8s.fail_job(NAMESPACE, jobs["failed"])
        assert k8s.delete_job(NAMESPACE, jobs["vanished"])
        ended = {
            "ran": wait_state(client, ids["ran"], "succeeded", controller),
            "failed": wait_state(client, ids["failed"], "failed", controller),
            "vanished": wait_state(client, ids["vanished"], "failed", controller),
        }
        events = client.get(f"/api/rollouts/{ids['ran']}/events").json()
        attempts = client.get(f"/api/rollouts/{ids['ran']}").json()["attempts"]
        time.sleep(1.5)  # a few more reconcile rounds: nothing more happens to ended rollouts and their Jobs
        assert controller.alive(), controller.log_text()[-4000:]
        after = {name: rollout(client, rollout_id) for name, rollout_id in ids.items()}
    log = controller.log_text()

    assert ended["ran"]["status"]["error_message"] is None
    reason = "Job failed: BackoffLimitExceeded — Job has reached the specified backoff limit"
    assert ended["failed"]["status"]["error_message"] == reason
    assert ended["vanished"]["status"]["error_message"] == "Job disappeared"
    assert all(after[name]["status"] == ended[name]["status"] for name in ids)
    # The agent's two calls (the calculator asked for, then the reflection) and its reward, all under attempt "0".
    assert [e["event_type"] for e in events] == ["model_request", "model_request", "reward"]
    assert {e["attempt_id"] for e in events} == {"0"} and attempts == ["0"]
    tool_message = next(m for m in events[1]["data"]["request"]["messages"] if m["role"] == "tool")
    assert "84" in tool_message["content"]
    # kr8s read the discovery documents, then listed and watched the managed Jobs within AGL's Role; the watch is
    # what saw the Job complete (the handler's own log line).
    assert {"/version", "/apis", "/apis/batch/v1"} <= set(k8s.discovery_requests)
    assert k8s.watch_requests and k8s.list_requests > 0 and k8s.forbidden == []
    assert any("Job completed" in line and ids["ran"] in line for line in log.splitlines()), log[-4000:]
    assert k8s.create_calls == 3  # one Job per rollout, never a second
