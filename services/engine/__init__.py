"""The inference engine AGL runs itself when no GPU deployment is given: vLLM's CPU build, and the tiny model
it serves in the embedded default.

`tiny_model` imports only torch/transformers (both venvs have them); `vllm_ext` is imported by vLLM inside
the engine's own venv and nowhere else.
"""

from __future__ import annotations
