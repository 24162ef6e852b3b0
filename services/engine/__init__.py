"""The inference engine AGL runs itself when no GPU deployment is given: vLLM's CPU build, and the tiny model
it serves in the embedded default.

`tiny_model` imports only torch/transformers (both venvs have them); `vllm_ext` is imported by vLLM inside
the engine's own venv and nowhere else. `python -m services.engine` (config, launch) starts the engine from
either venv; `control.EngineControl` drives a running engine's admin routes (httpx only). This file imports
nothing, so vLLM's worker can import `vllm_ext` without pulling in the rest.
"""

from __future__ import annotations
