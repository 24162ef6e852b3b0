"""Multi-node training, simulated on this machine: `tools/multinode_sim.py` starts a Ray head and a second raylet
(`ray start --address`, its own resources, ports and temp dir), and submits `agl-trainer placement=cpu
trainer.nnodes=2` with `ray job submit`. verl places one actor rank on each node, FSDP2 runs over gloo between them,
and the trainer works against the real ledger, proxy and controller (local processes, auth on) and the real CPU
vLLM engine, as on one node. The tool is run as a user runs it; Ray's state API says where each rank ran.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, Stack, endpoint_version, max_weight_change, trainer_overrides, write_tasks
from tools.multinode_sim import HEAD, NODE_START_TRIES, WORKER, Cluster, NodeExited, ray_environment, start_until_up

# The two-raylet training run (multinode, ~100 s on top of the shared engine): `make multinode-test` runs this file
# alone. Its nodes keep Ray's address file in their own temp dir, so a trainer that another test worker starts
# meanwhile never joins this cluster (ray.init reads the default temp dir's).
pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1500)]

TOOL = Path(__file__).resolve().parents[2] / "tools" / "multinode_sim.py"
STEPS = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("multinode"), cpu_engine) as started:
        yield started


async def _run_steps(stack: Stack, run_id: str) -> dict[int, dict[str, float]]:
    async with stack.client() as client:
        return {s.step: dict(s.metrics) for s in await client.list_run_steps(run_id) if s.step > 0}


@pytest.mark.multinode
def test_a_ray_job_over_two_raylets_trains_with_a_rank_on_each_node(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    run_id = "multinode2"
    out = stack.root / run_id
    out.mkdir()
    cpu_engine.restore_base_weights()
    # Parity tasks: the agent's tie-break gives every group a reward signal, so both steps update and push.
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 4)
    overrides = [f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    overrides += trainer_overrides(cpu_engine, run_id, tasks, out, steps=STEPS, lr=1e-3)
    overrides.append("trainer.logger=[console]")
    report_file = tmp_path / "report.json"
    argv = [sys.executable, str(TOOL), "--logs", str(tmp_path / "ray-logs"), "--report", str(report_file), "--"]
    proc = subprocess.run([*argv, *overrides], capture_output=True, text=True, timeout=1400, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]

    report = json.loads(report_file.read_text())
    assert report["status"] == "SUCCEEDED", report
    # Two ranks (WORLD_SIZE 2: verl's worker group over both placement groups), one on each raylet.
    assert sorted(rank["node"] for rank in report["ranks"]) == [HEAD, WORKER], report
    assert len({rank["node_id"] for rank in report["ranks"]}) == 2, report
    assert sorted(rank["node_index"] for rank in report["ranks"]) == [0, 1], report

    # The run's metrics are in the ledger, one record a step; each step updated and pushed to the engine.
    steps = asyncio.run(_run_steps(stack, run_id))
    assert sorted(steps) == list(range(1, STEPS + 1)), output[-3000:]
    for n, step in steps.items():
        assert "actor/pg_loss" in step and "actor/grad_norm" in step, (n, step)
        assert step["agl/push/engines"] == 1.0, (n, step)
        assert step["agl/rollout/succeeded"] == 8.0, (n, step)
    # Step 2's rows were sampled after step 1's push: the engine serves what the two ranks trained.
    assert steps[2]["agl/push/logprob_diff_max"] < 1e-4, steps[2]
    assert asyncio.run(endpoint_version(stack)) == STEPS
    assert max_weight_change(cpu_engine.model_dir, out / "weights") > 0.0


def test_a_node_whose_ray_start_exits_is_tried_again_with_fresh_ports_and_ray_s_own_logs_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray start` exits when its GCS or raylet is not up within its fixed 30 s (a port picked free and taken by the
    time Ray binds it; CI saw it once): the node is started again with fresh ports, and when every try failed the
    error carries the tails of Ray's GCS and raylet logs, which say why."""
    session_logs = tmp_path / "head" / "session_latest" / "logs"
    session_logs.mkdir(parents=True)
    (session_logs / "gcs_server.err").write_text("Failed to bind to address 127.0.0.1:41234\n")
    tries: list[int] = []

    def argv_for() -> list[str]:
        tries.append(len(tries) + 1)
        return [sys.executable, "-c", f"print('ray start, try {len(tries)}: timed out'); raise SystemExit(1)"]

    cluster = Cluster("", "", [])
    with pytest.raises(NodeExited) as raised:
        start_until_up(cluster, HEAD, argv_for, tmp_path / "head", tmp_path, ray_environment(), 60)
    assert tries == list(range(1, NODE_START_TRIES + 1)) and cluster.nodes == []
    message = str(raised.value)
    assert f"`ray start` of {HEAD} exited with 1" in message and f"try {NODE_START_TRIES}: timed out" in message
    assert "[gcs_server.err]" in message and "Failed to bind to address 127.0.0.1:41234" in message
    assert f"(the last of {NODE_START_TRIES} tries)" in message
    assert capsys.readouterr().err.count(f"starting {HEAD} again, with fresh ports") == NODE_START_TRIES - 1
