"""Greedy output of verl's colocated replicas after the first weight sync against Hugging Face `generate` on the same
checkpoint (issue 28 item 3): the weights verl's checkpoint engine hands the replicas at the start of a launch are the
model directory's, so a replica asked then must continue a prompt greedily as transformers does on that directory.

The replica is asked beside the trainer (`ask_greedy`, while the ledger registers it at weights version 0, before
and after the call); transformers runs once the trainer is gone and the GPU is free (`hf_greedy`). Both in the
rollout's dtype (verl's default bfloat16): where the two differ, the check accepts a first divergence only at a
near-tie of Hugging Face's top two logits (`greedy_agrees`). The pure checks are tested on CPU, `hf_greedy` too
(tests/trainer/test_gpu_smoke_checks.py); the replica's side has not yet run against a GPU replica.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

PROMPT = "Question: what is 7 + 5? Answer:"
NEW_TOKENS = 16
# Logits: a first divergence where Hugging Face's top two are closer than this is rounding, not wrong weights.
TIE = 0.05
FIRST_VERSION = 0  # the weights version a launch's replicas are registered at before its first update


def prompt_ids(model_dir: Path, prompt: str = PROMPT) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model_dir).encode(prompt))


async def ask_greedy(
    http: httpx.AsyncClient, endpoint: str, model_name: str, ids: Sequence[int], new_tokens: int = NEW_TOKENS
) -> dict[str, Any]:
    """One replica's greedy continuation of the token ids (vLLM's /v1/completions, temperature 0):
    {"ids": [...]} or {"error": why}."""
    body = {"model": model_name, "prompt": list(ids), "max_tokens": new_tokens, "temperature": 0}
    body |= {"return_token_ids": True}
    try:
        answer = await http.post(f"{endpoint.rstrip('/')}/completions", json=body)
        if not answer.is_success:
            return {"error": f"HTTP {answer.status_code}: {answer.text[:200]}"}
        return {"ids": [int(t) for t in answer.json()["choices"][0]["token_ids"]]}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def hf_greedy(
    model_dir: Path, ids: Sequence[int], new_tokens: int = NEW_TOKENS, device: str = "cuda", dtype: str = "bfloat16"
) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of the token ids on `model_dir`, and at each new token the gap between its
    top two logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    eos = model.generation_config.eos_token_id
    inputs = torch.tensor([list(ids)], device=device)
    with torch.no_grad():
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            do_sample=False,
            max_new_tokens=new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=eos[0] if isinstance(eos, list) else eos,
        )
    new = [int(t) for t in out.sequences[0, inputs.shape[1] :]]
    margins = []
    for logits in out.logits:
        top = logits[0].float().topk(2).values
        margins.append(float(top[0] - top[1]))
    return new, margins


def greedy_agrees(
    engine: Sequence[int], hf: Sequence[int], margins: Sequence[float], tie: float = TIE
) -> tuple[bool, str]:
    """The engine's greedy tokens equal transformers', or first differ where transformers' top two logits are a
    near-tie (both then follow their own token; what comes after is not compared)."""
    first = next((i for i, (a, b) in enumerate(zip(engine, hf, strict=False)) if a != b), None)
    if first is None and len(engine) == len(hf):
        return True, f"{len(hf)} tokens equal"
    if first is None:
        return False, f"equal for {min(len(engine), len(hf))} tokens, then lengths {len(engine)} vs {len(hf)}"
    gap = margins[first] if first < len(margins) else float("inf")
    said = f"first differ at token {first} ({engine[first]} vs {hf[first]}), top-two gap {gap:.3f}"
    return gap < tie, said + (" (a near-tie)" if gap < tie else "")


def replicas_agree(
    answers: Mapping[str, Mapping[str, Any]], hf: Sequence[int], margins: Sequence[float]
) -> tuple[bool, str]:
    """Every replica answered greedily while registered at the first weights version, as transformers does.
    `answers`: {endpoint: {"greedy": ask_greedy's answer, "versions": (before, after)}}."""
    if not answers:
        return False, "no replica was asked"
    ok, lines = True, []
    for endpoint, answer in sorted(answers.items()):
        greedy, versions = answer.get("greedy", {}), tuple(answer.get("versions", ()))
        if versions != (FIRST_VERSION, FIRST_VERSION):
            ok = False
            lines.append(f"{endpoint} asked at weights versions {versions}, not the first sync's")
        elif "ids" not in greedy:
            ok = False
            lines.append(f"{endpoint}: {greedy.get('error', 'no answer')}")
        else:
            agrees, detail = greedy_agrees(greedy["ids"], hf, margins)
            ok = ok and agrees
            lines.append(f"{endpoint}: {detail}")
    return ok, "; ".join(lines)
