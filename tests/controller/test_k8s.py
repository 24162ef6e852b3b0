"""Kubernetes runner end to end: the real controller and ledger, and a stand-in API server for batch/v1 Jobs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import yaml

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token
from services.controller.k8s.job_template import job_name
from services.controller.k8s.k8s_api import KubeError, KubeJobs, load_api_client
from tests.controller.conftest import KEY, RBAC, Controller, Stack, run_controller, spec, wait_for
from tests.controller.k8s_standin import K8sStandin

NS = "agl-agents"
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING

TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: my-agent
  labels:
    team: rl
spec:
  backoffLimit: 4
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: agent
          image: registry.example/agent:1
          env:
            - name: QUESTION
              value: {{ input.question | yaml_escape }}
            - name: AGL_KEY
              value: not-the-token
"""


@contextlib.contextmanager
def k8s_controller(
    stack: Stack, tmp_path: Path, k8s: K8sStandin, args: Sequence[str] = (), controller_id: str = ""
) -> Iterator[Controller]:
    kubeconfig = k8s.write_kubeconfig(tmp_path / "kubeconfig")
    argv = ["--runner", "k8s", "--kubeconfig", str(kubeconfig), "--namespace", NS, "--reconcile-interval", "1"]
    with run_controller(stack, tmp_path, controller_id=controller_id, args=[*argv, *args]) as controller:
        yield controller


def job_spec(
    question: str = "What is 2 + 2?", template: str = TEMPLATE, timeout_s: float = 600
) -> rollout_pb2.RolloutSpec:
    return spec(job_template=template, input_value={"question": question}, timeout_s=timeout_s)


def wait_job(k8s: K8sStandin, rollout_id: str) -> dict:
    name = job_name(rollout_id)
    k8s.wait_for(lambda: k8s.job(NS, name) is not None)
    return k8s.job(NS, name)  # type: ignore[return-value]


async def test_job_is_rendered_with_forced_fields_and_agent_env(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    question = 'He said "2 + 2"?\nanswer: 4 # not a comment'
    k8s.fail_next_creates = [500, 429]  # transient: retried with backoff
    k8s.lose_next_create_responses = 1  # then stored but answered 504: the retry meets 409 and adopts the Job
    with k8s_controller(stack, tmp_path, k8s, args=["--job-ttl", "120"]) as controller:
        [created] = await ledger.create_rollouts([job_spec(question, timeout_s=42)])
        rid = created.rollout_id
        job = await asyncio.to_thread(wait_job, k8s, rid)
        rollout = (await wait_for(ledger, [rid], states=[RUNNING]))[rid]
        aid = rollout.status.attempt_id
        assert rollout.status.launcher_ref == f"job:{NS}/{job_name(rid)}"
        assert rollout.status.controller_id == controller.controller_id

        metadata = job["metadata"]
        assert (metadata["name"], metadata["namespace"]) == (job_name(rid), NS)
        assert metadata["labels"]["team"] == "rl"
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "agl-controller"
        assert metadata["labels"]["agl.io/rollout-id"] == rid
        assert metadata["labels"]["agl.io/attempt-id"] == aid
        assert job["spec"]["backoffLimit"] == 0
        assert job["spec"]["activeDeadlineSeconds"] == 42
        assert job["spec"]["ttlSecondsAfterFinished"] == 120
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["restartPolicy"] == "Never"
        env = {item["name"]: item["value"] for item in pod_spec["containers"][0]["env"]}
        assert [item["name"] for item in pod_spec["containers"][0]["env"]].count("AGL_KEY") == 1
        assert env == {
            "QUESTION": question,
            "AGL_OPENAI_BASE_URL": f"{stack.proxy_url}/proxy/rollout/{rid}/attempt/{aid}/mode/train/openai/v1",
            "AGL_EVENT_URL": f"{stack.proxy_url}/api/rollouts/{rid}/attempt/{aid}/events",
            "AGL_KEY": agent_token(KEY, rid, aid),
        }

        k8s.complete_job(NS, job_name(rid))
        rollout = (await wait_for(ledger, [rid]))[rid]
        assert rollout.status.state == SUCCEEDED, rollout.status.error_message
    assert k8s.create_calls == 4
    assert k8s.created == [job_name(rid)]


async def test_job_failure_and_deadline_map_to_reasons(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    with k8s_controller(stack, tmp_path, k8s):
        failing, slow, vanishing = await ledger.create_rollouts([job_spec(), job_spec(timeout_s=1), job_spec()])
        for created in (failing, vanishing):
            await asyncio.to_thread(wait_job, k8s, created.rollout_id)
        await wait_for(ledger, [failing.rollout_id, vanishing.rollout_id], states=[RUNNING])
        log = "Traceback (most recent call last):\nValueError: boom\n"
        k8s.fail_job(NS, job_name(failing.rollout_id), exit_code=3, log=log)
        k8s.delete_job(NS, job_name(vanishing.rollout_id))
        done = await wait_for(ledger, [failing.rollout_id, slow.rollout_id, vanishing.rollout_id])
    reason = {rid: r.status.error_message for rid, r in done.items()}
    assert all(r.status.state == FAILED for r in done.values()), reason
    assert reason[failing.rollout_id].startswith(f"Job {job_name(failing.rollout_id)} failed: BackoffLimitExceeded")
    assert "container agent exited with code 3 (Error)" in reason[failing.rollout_id]
    assert "ValueError: boom" in reason[failing.rollout_id]
    assert reason[slow.rollout_id].startswith("timed out after 1 s")
    assert reason[vanishing.rollout_id] == f"Job {NS}/{job_name(vanishing.rollout_id)} vanished before it finished"


async def test_a_reward_left_as_the_termination_message_is_posted_unless_the_agent_posted_one(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    """`agent_runner --result-file /dev/termination-log` leaves run()'s number as the container's termination
    message; the controller reads it from the succeeded pod's status and posts it before the rollout succeeds."""
    with k8s_controller(stack, tmp_path, k8s):
        returns, posts, text, failing = await ledger.create_rollouts([job_spec() for _ in range(4)])
        jobs = {
            r.rollout_id: await asyncio.to_thread(wait_job, k8s, r.rollout_id) for r in (returns, posts, text, failing)
        }
        await wait_for(ledger, list(jobs), states=[RUNNING])
        # The agent posts its reward through the proxy with the variables the Job was given, then returns another.
        env = {
            e["name"]: e["value"] for e in jobs[posts.rollout_id]["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        async with httpx.AsyncClient() as client:
            reply = await client.post(
                env["AGL_EVENT_URL"],
                json={"event_type": "reward", "data": {"value": 1.0}},
                headers={"Authorization": f"Bearer {env['AGL_KEY']}"},
            )
        assert reply.status_code == 200, reply.text
        for created, message in ((returns, '{"value": 0.75}'), (posts, '{"value": 0.25}'), (text, "all done")):
            k8s.complete_job(NS, job_name(created.rollout_id), termination_message=message)
        k8s.fail_job(NS, job_name(failing.rollout_id))
        done = await wait_for(ledger, [r.rollout_id for r in (returns, posts, text, failing)])

    def rewards(rollout_id: str) -> list[tuple[float, str]]:
        return [(e.reward.value, e.reward.source) for e in events[rollout_id] if e.event_type == "reward"]

    ids = [r.rollout_id for r in (returns, posts, text)]
    assert [done[rid].status.state for rid in ids] == [SUCCEEDED] * 3
    assert done[failing.rollout_id].status.state == FAILED
    events = {rid: await ledger.list_events(rid, event_type="reward") for rid in done}
    assert rewards(returns.rollout_id) == [(0.75, "returned")]
    assert events[returns.rollout_id][0].attempt_id == done[returns.rollout_id].status.attempt_id
    assert rewards(posts.rollout_id) == [(1.0, "")]  # the agent's own (it gave no source); 0.25 ignored
    assert rewards(text.rollout_id) == []
    assert rewards(failing.rollout_id) == []
    # The trainer's terminal feed carries the returned reward with the rollout.
    terminal = await ledger.list_terminal(include_events=True)
    fed = {
        e.rollout.rollout_id: [ev.reward.value for ev in e.events if ev.event_type == "reward"]
        for e in terminal.entries
    }
    assert fed[returns.rollout_id] == [0.75]
    assert event_pb2.Reward(value=0.75, source="returned") == events[returns.rollout_id][0].reward


async def test_unusable_templates_fail_the_rollout_at_once(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    no_image = TEMPLATE.replace("          image: registry.example/agent:1\n", "")
    with k8s_controller(stack, tmp_path, k8s):
        taken = job_spec()
        # A Job of that name from another attempt is already there (say, an old rollout with the same id).
        stale = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job_name(taken.rollout_id), "annotations": {"agl.io/attempt-id": "old"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "b"}]}}},
        }
        await asyncio.to_thread(_create_directly, k8s.write_kubeconfig(tmp_path / "direct-kubeconfig"), stale)
        created = await ledger.create_rollouts(
            [
                spec(job_template=TEMPLATE, input_value={"other": 1}),
                job_spec(template=TEMPLATE + "---\n" + TEMPLATE),
                job_spec(template="{% if %}"),
                spec(command=["true"]),
                job_spec(template=no_image),
                taken,
            ]
        )
        done = await wait_for(ledger, [r.rollout_id for r in created])
    missing, two_docs, syntax, no_template, rejected, conflict = (done[r.rollout_id] for r in created)
    assert all(r.status.state == FAILED for r in done.values())
    assert "'dict object' has no attribute 'question'" in missing.status.error_message
    assert "exactly one YAML document, got 2" in two_docs.status.error_message
    assert "syntax error" in syntax.status.error_message
    assert "no Job template" in no_template.status.error_message
    assert "rejected by the API server: 422 Invalid" in rejected.status.error_message
    assert "image: Required value" in rejected.status.error_message
    assert "already exists for attempt 'old'" in conflict.status.error_message
    for rollout in (missing, two_docs, syntax, no_template):
        assert rollout.status.attempt_id == ""  # failed from queuing, nothing was launched
    assert sorted(k8s.created) == [job_name(taken.rollout_id)]


def _create_directly(kubeconfig: Path, manifest: dict) -> None:
    KubeJobs(load_api_client(str(kubeconfig)), NS).create(manifest)


async def test_watch_resumes_and_relists_after_410_gone(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    # No periodic re-list during this test: only the watch can report the completion.
    with k8s_controller(stack, tmp_path, k8s, args=["--reconcile-interval", "3600"]):
        first, second = await ledger.create_rollouts([job_spec(), job_spec()])
        await asyncio.to_thread(wait_job, k8s, first.rollout_id)
        await asyncio.to_thread(wait_job, k8s, second.rollout_id)
        await wait_for(ledger, [first.rollout_id, second.rollout_id], states=[RUNNING])
        lists_before = k8s.list_requests
        k8s.complete_job(NS, job_name(first.rollout_id))
        await wait_for(ledger, [first.rollout_id])
        k8s.expire_watches()  # the open watch ends; resuming from its resourceVersion now gets 410
        await asyncio.to_thread(k8s.wait_for, lambda: k8s.list_requests > lists_before)
        k8s.complete_job(NS, job_name(second.rollout_id))
        done = await wait_for(ledger, [first.rollout_id, second.rollout_id])
    assert all(r.status.state == SUCCEEDED for r in done.values())
    resumed = [rv for rv in k8s.watch_requests if rv != "0"]
    assert len(resumed) >= 2  # the first watch, and the attempt to resume that got 410


async def test_restart_adopts_existing_jobs_instead_of_recreating(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    with k8s_controller(stack, tmp_path, k8s, controller_id="k8s-restart") as first:
        kept, lost = await ledger.create_rollouts([job_spec(), job_spec()])
        await asyncio.to_thread(wait_job, k8s, kept.rollout_id)
        await asyncio.to_thread(wait_job, k8s, lost.rollout_id)
        await wait_for(ledger, [kept.rollout_id, lost.rollout_id], states=[RUNNING])
        assert first.process.terminate() == 0
    # Jobs outlive the controller: their rollouts stay running.
    assert (await ledger.get_rollout(kept.rollout_id)).status.state == RUNNING
    k8s.delete_job(NS, job_name(lost.rollout_id))
    # An unfinished Job of this controller that no rollout waits for (say, its rollout was deleted meanwhile).
    orphan = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "agl-orphan",
            "labels": {"app.kubernetes.io/managed-by": "agl-controller"},
            "annotations": {"agl.io/controller-id": "k8s-restart", "agl.io/rollout-id": "gone"},
        },
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "b"}]}}},
    }
    await asyncio.to_thread(_create_directly, k8s.write_kubeconfig(tmp_path / "direct-kubeconfig"), orphan)
    with k8s_controller(stack, tmp_path, k8s, controller_id="k8s-restart") as second:
        done = await wait_for(ledger, [lost.rollout_id])
        assert "not found after a controller restart" in done[lost.rollout_id].status.error_message
        await asyncio.to_thread(k8s.wait_for, lambda: "adopted Job" in second.process.log_text())
        k8s.complete_job(NS, job_name(kept.rollout_id))
        done = await wait_for(ledger, [kept.rollout_id])
        await asyncio.to_thread(k8s.wait_for, lambda: k8s.job(NS, "agl-orphan") is None)
    assert done[kept.rollout_id].status.state == SUCCEEDED
    assert k8s.create_calls == 3  # two by the first run, the orphan by the test: nothing recreated


async def test_a_live_controller_adopts_a_dead_ones_jobs(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    """Controller A is killed (kill -9) with two Jobs running; B, another id, takes over once A's lease expires:
    the Job that still exists is adopted and followed to its end, the one deleted meanwhile fails the attempt."""
    lease = ["--lease-ttl", "1"]
    with k8s_controller(stack, tmp_path, k8s, lease, controller_id="k8s-dead") as first:
        kept, lost = await ledger.create_rollouts([job_spec(), job_spec()])
        await asyncio.to_thread(wait_job, k8s, kept.rollout_id)
        await asyncio.to_thread(wait_job, k8s, lost.rollout_id)
        await wait_for(ledger, [kept.rollout_id, lost.rollout_id], states=[RUNNING])
        first.process.kill()
    k8s.delete_job(NS, job_name(lost.rollout_id))
    with k8s_controller(stack, tmp_path, k8s, lease, controller_id="k8s-live") as second:
        done = await wait_for(ledger, [lost.rollout_id])
        status = done[lost.rollout_id].status
        assert status.state == FAILED and status.failure_reason == rollout_pb2.FAILURE_REASON_LOST
        assert "not found after controller k8s-dead stopped heartbeating at" in status.error_message
        await asyncio.to_thread(k8s.wait_for, lambda: "adopted Job" in second.process.log_text())
        adopted = await ledger.get_rollout(kept.rollout_id)
        assert adopted.status.state == RUNNING and adopted.status.controller_id == "k8s-live"
        k8s.complete_job(NS, job_name(kept.rollout_id))
        done = await wait_for(ledger, [kept.rollout_id])
    assert done[kept.rollout_id].status.state == SUCCEEDED
    assert [a.attempt_id for a in done[kept.rollout_id].status.attempts] == [adopted.status.attempt_id]
    assert k8s.create_calls == 2  # adopted, not recreated


async def test_job_creation_is_rate_limited(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    # The controller's bucket is made after this instant: 2 tokens, then one every 30 s. On a quiet machine the
    # test ends well inside 30 s (exactly the burst is created); on a loaded one (a CI run beside other jobs took
    # longer) a refill may come, and each one is allowed for exactly as long as the clock says.
    started = time.monotonic()
    with k8s_controller(stack, tmp_path, k8s, args=["--max-jobs-per-minute", "2", "--job-burst", "2"]):
        created = await ledger.create_rollouts([job_spec() for _ in range(4)])
        await asyncio.to_thread(k8s.wait_for, lambda: len(k8s.created) >= 2)
        await asyncio.sleep(1.5)  # nothing more may be created meanwhile, unless 30 s passed since the start
        jobs = len(k8s.created)
        states = [(await ledger.get_rollout(r.rollout_id)).status.state for r in created]
        allowed = 2 + int((time.monotonic() - started) // 30)
        assert 2 <= jobs <= min(4, allowed), (jobs, allowed)
        assert sorted(states) == sorted([QUEUING] * (4 - jobs) + [RUNNING] * jobs)


def test_the_role_is_least_privilege() -> None:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(RBAC.read_text())}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    rules = {(group, resource): sorted(rule["verbs"]) for rule in docs["Role"]["rules"]
             for group in rule["apiGroups"] for resource in rule["resources"]}  # fmt: skip
    assert rules == {
        ("batch", "jobs"): ["create", "delete", "get", "list", "watch"],
        ("", "pods"): ["get", "list"],
        ("", "pods/log"): ["get"],
    }
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]


def test_standin_enforces_the_role(tmp_path: Path) -> None:
    rules = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]}]
    with K8sStandin(rbac_rules=rules) as standin:
        jobs = KubeJobs(load_api_client(str(standin.write_kubeconfig(tmp_path / "kubeconfig"))), NS)
        assert jobs.list("")[0] == []
        with pytest.raises(KubeError) as denied:
            jobs.get("any")
        assert denied.value.status == 403
        assert standin.forbidden == [f"GET /apis/batch/v1/namespaces/{NS}/jobs/any"]


def test_standin_serves_discovery_to_any_authenticated_caller(tmp_path: Path) -> None:
    """Discovery as a real API server serves it (what kr8s reads before anything else, v1.0's controller's client):
    the official client's typed models take every document, a Role that grants nothing does not hide them, and a
    caller without the token gets 401."""
    import kubernetes

    with K8sStandin(rbac_rules=[]) as standin:
        api = load_api_client(str(standin.write_kubeconfig(tmp_path / "kubeconfig")))
        assert kubernetes.client.VersionApi(api).get_code().git_version == "v1.31.0"
        assert kubernetes.client.CoreApi(api).get_api_versions().versions == ["v1"]
        (group,) = kubernetes.client.ApisApi(api).get_api_versions().groups
        assert group.name == "batch" and group.preferred_version.group_version == "batch/v1"
        jobs = kubernetes.client.BatchV1Api(api).get_api_resources()
        assert jobs.group_version == "batch/v1"
        assert [(r.name, r.kind, r.namespaced) for r in jobs.resources] == [("jobs", "Job", True)]
        pods = kubernetes.client.CoreV1Api(api).get_api_resources()
        assert {r.name for r in pods.resources} == {"pods", "pods/log"}
        assert httpx.get(f"{standin.url}/version/", headers={"Authorization": f"Bearer {standin.token}"}).is_success
        assert httpx.get(f"{standin.url}/apis").status_code == 401
        with pytest.raises(KubeError) as denied:  # the Role still decides for the resources themselves
            KubeJobs(api, NS).list("")
        assert denied.value.status == 403
        assert standin.discovery_requests == ["/version", "/api", "/apis", "/apis/batch/v1", "/api/v1", "/version"]
