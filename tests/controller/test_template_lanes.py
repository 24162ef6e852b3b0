"""Slow Job templates against the real controller (k8s runner, stand-in API server), issue 30 finding 14: eight
templates that burn CPU until the render time limit do not hold up a valid rollout's Job, and a render whose output
is over the byte limit in UTF-8 (though not in characters) is refused clearly without breaking the render workers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from tests.controller.conftest import Stack, wait_for
from tests.controller.k8s_standin import K8sStandin
from tests.controller.test_k8s import NS, job_spec, k8s_controller, wait_job
from tests.controller.test_template_limits import hostile

FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
# 10**10 loop steps: CPU until the time limit stops it.
BURNS_CPU = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


async def wait_ready(url: str, timeout_s: float = 20.0) -> None:
    """Until the controller's /readyz is 200: subscribed to the queue (its Kubernetes runner started before)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while (await client.get(url)).status_code != 200:
            assert time.monotonic() < deadline, f"{url} not ready after {timeout_s} s"
            await asyncio.sleep(0.05)


async def test_slow_templates_do_not_hold_up_a_valid_rollouts_job(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    timeout_s = 2.0
    args = ["--template-timeout", str(timeout_s), "--template-workers", "2"]
    with k8s_controller(stack, tmp_path, k8s, args=args) as controller:
        await wait_ready(controller.metrics_url.replace("/metrics", "/readyz"))
        slow = await ledger.create_rollouts([job_spec(template=hostile(BURNS_CPU)) for _ in range(8)])
        await asyncio.sleep(0.2)  # the slow renders are under way before the valid rollout is created
        started = time.monotonic()
        [good] = await ledger.create_rollouts([job_spec("What is 2 + 2?")])
        job = await asyncio.to_thread(wait_job, k8s, good.rollout_id)
        delay_s = time.monotonic() - started
        print(f"valid rollout's Job created {delay_s:.2f} s after it, behind 8 slow templates")
        k8s.complete_job(NS, job["metadata"]["name"])
        done = await wait_for(ledger, [good.rollout_id, *(r.rollout_id for r in slow)], timeout_s=60)
    # Before: 8 renders of 2 s on 2 workers put the valid one 8 s behind; now it waits at most a quick limit
    # (0.25 s) per earlier render and fast-lane worker, about 1 s here.
    assert delay_s < timeout_s, f"the valid rollout's Job was created {delay_s:.1f} s after it"
    assert done[good.rollout_id].status.state == SUCCEEDED
    for rollout in slow:
        status = done[rollout.rollout_id].status
        assert status.state == FAILED
        assert status.error_message.startswith(f"invalid Job template: rendering took longer than {timeout_s:g} s")


# 1,000,000 characters, 2,000,000 bytes in UTF-8: under the limit counted in characters, twice over it in bytes.
NON_ASCII = "{{ 'é' * 1000000 }}"
# A 2 KB text whose Job, as JSON, has 10 MB: each alias repeats the node before it ten times.
ALIASES = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: aliases
  annotations:
    a0: &a0 "{{ 'x' * 1000 }}"
    a1: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]
    a2: &a2 [*a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1]
    a3: &a3 [*a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2]
    a4: [*a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3]
spec:
  template:
    spec:
      containers:
        - name: agent
          image: registry.example/agent:1
"""
# About 0.3 s of rendering: over the quick limit below, well within the time limit.
TAKES_A_WHILE = "{% for a in range(100000) %}{% endfor %}ok"


async def test_oversized_output_is_refused_clearly_and_slow_valid_templates_still_render(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    args = ["--template-timeout", "3", "--template-quick-limit", "0.05", "--template-workers", "1"]
    with k8s_controller(stack, tmp_path, k8s, args=args) as controller:
        non_ascii, aliases = await ledger.create_rollouts(
            [job_spec(template=hostile(NON_ASCII)), job_spec(template=ALIASES)]
        )
        refused = await wait_for(ledger, [non_ascii.rollout_id, aliases.rollout_id])
        slow_valid, valid = await ledger.create_rollouts([job_spec(template=hostile(TAKES_A_WHILE)), job_spec()])
        for rollout in (slow_valid, valid):
            job = await asyncio.to_thread(wait_job, k8s, rollout.rollout_id)
            k8s.complete_job(NS, job["metadata"]["name"])
        done = await wait_for(ledger, [slow_valid.rollout_id, valid.rollout_id])
        log_text = controller.process.log_text()
    status = refused[non_ascii.rollout_id].status
    assert status.state == FAILED
    assert status.error_message == "invalid Job template: it renders to more than 1048576 bytes (the limit)"
    status = refused[aliases.rollout_id].status
    assert status.state == FAILED
    assert status.error_message.startswith("invalid Job template: the rendered Job is more than 2097152 bytes as JSON")
    assert all(r.status.state == SUCCEEDED for r in done.values()), [r.status.error_message for r in done.values()]
    env = wait_job(k8s, slow_valid.rollout_id)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "QUESTION", "value": "ok"} in env
    assert "render worker" not in log_text  # no worker was stopped or broken on the way
