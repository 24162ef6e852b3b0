"""The installed `agl-trainer` console script composes the GPU config a user gets (as a user starts it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.trainer

AGL_TRAINER = Path(sys.executable).parent / "agl-trainer"


def test_cfg_job_carries_the_engines_served_name_and_tool_call_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert AGL_TRAINER.is_file(), f"{AGL_TRAINER} is not installed (make install-dev)"
    for name in [k for k in os.environ if k.startswith("AGL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AGL_MODEL_NAME", "qwen-policy")
    monkeypatch.setenv("HOME", str(tmp_path))
    done = subprocess.run(
        [str(AGL_TRAINER), "--cfg", "job", "agl.launch.agent_class=x:Y"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = OmegaConf.create(done.stdout)
    # What Hydra prints keeps the interpolations: the engine flags follow agl.model_name / agl.tool_calls.*.
    vllm = printed.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert OmegaConf.to_container(vllm) == {
        "served_model_name": "${agl.model_name}",
        "enable_auto_tool_choice": "${agl.tool_calls.enable_auto_tool_choice}",
        "tool_call_parser": "${agl.tool_calls.parser}",
        "enable_scale_out": True,
    }
    # Resolved as the job resolves it (same environment): the routed name and the parser reach the engines.
    job = OmegaConf.to_container(printed, resolve=True)
    rollout = job["actor_rollout_ref"]["rollout"]
    assert rollout["engine_kwargs"]["vllm"] == {
        "served_model_name": "qwen-policy",
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "enable_scale_out": True,
    }
    assert rollout["engine_kwargs"]["sglang"] == {"served_model_name": "qwen-policy", "tool_call_parser": "hermes"}
    assert rollout["prometheus"]["served_model_name"] == "qwen-policy"
    assert rollout["name"] == "vllm" and rollout["tensor_model_parallel_size"] == 1
    assert job["trainer"]["n_gpus_per_node"] == 1 and job["data"]["val_files"] is None
    assert job["trainer"]["default_local_dir"] == f"{tmp_path}/agl-trainer/checkpoints/agl/agl-run"
    assert job["agl"]["state_dir"].startswith(f"{tmp_path}/agl-trainer/")
