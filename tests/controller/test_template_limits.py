"""Hostile Job templates (issue 17 #7) against the real controller (k8s runner, stand-in API server): each fails its
own rollout with a clear reason while a good rollout queued behind them is launched and finished."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.controller.core.outcome import ConfigError
from services.controller.k8s.job_template import render_text
from tests.controller.conftest import Stack, read_metrics, wait_for
from tests.controller.k8s_standin import K8sStandin
from tests.controller.test_k8s import NS, TEMPLATE, job_spec, k8s_controller, wait_job

FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED

HOSTILE = {
    "power": ("{{ 10**10000000 }}", "would exceed 4096 bits"),
    "repeat": ("{{ 'a' * 10**10 }}", "over the 1048576-byte output limit"),
    "repeat_1e8": ("{{ 'a' * 10**8 }}", "over the 1048576-byte output limit"),
    "loops": (
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "rendering took longer than 1 s",
    ),
    "memory": ("{{ 'a'.ljust(2**32) }}", "ran out of memory"),
    "output": ("{% for i in range(300) %}{{ 'x' * 10000 }}{% endfor %}", "renders to more than 1048576 bytes"),
}


def hostile(body: str) -> str:
    return TEMPLATE.replace("{{ input.question | yaml_escape }}", body)


async def test_hostile_templates_fail_their_rollouts_and_hold_up_no_other(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, k8s: K8sStandin
) -> None:
    args = ["--template-timeout", "1", "--template-memory-mb", "512"]
    with k8s_controller(stack, tmp_path, k8s, args=args) as controller:
        bad = await ledger.create_rollouts([job_spec(template=hostile(body)) for body, _ in HOSTILE.values()])
        [good] = await ledger.create_rollouts([job_spec("What is 2 + 2?")])
        await asyncio.to_thread(wait_job, k8s, good.rollout_id)
        done = await wait_for(ledger, [r.rollout_id for r in bad], timeout_s=60)
        k8s.complete_job(NS, wait_job(k8s, good.rollout_id)["metadata"]["name"])
        finished = await wait_for(ledger, [good.rollout_id])
        refused = 'agl_controller_rollouts_failed_total{reason="invalid_config"}'
        metrics = read_metrics(controller.metrics_url, {refused: 6})
        controller_alive = controller.process.alive()
    assert finished[good.rollout_id].status.state == SUCCEEDED
    for rollout, (name, (_, expected)) in zip(bad, HOSTILE.items(), strict=True):
        status = done[rollout.rollout_id].status
        assert status.state == FAILED, name
        assert status.failure_reason == rollout_pb2.FAILURE_REASON_INVALID_CONFIG, name
        assert status.error_message.startswith("invalid Job template"), (name, status.error_message)
        assert expected in status.error_message, (name, status.error_message)
    assert f"{refused} 6.0" in metrics
    assert 'agl_controller_launched_total{mode="job"} 1.0' in metrics  # only the good one was launched
    assert controller_alive
    assert k8s.created == [wait_job(k8s, good.rollout_id)["metadata"]["name"]]


EXPLODING = ["{{ 10**10000000 }}", "{{ 'a' * 10**10 }}", "{{ [1] * 10**9 }}", "{{ 3 * 10**5000 }}", "{{ 'ab' + 'c' }}"]


@pytest.mark.parametrize("template", EXPLODING)
def test_the_sandbox_refuses_exploding_arithmetic_before_computing_it(template: str) -> None:
    if template == "{{ 'ab' + 'c' }}":
        assert render_text(template, {}) == "abc"
        return
    with pytest.raises(ConfigError, match="refused in a Job template"):
        render_text(template, {})
