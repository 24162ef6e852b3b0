"""Request checks and rewriting per mode: the model, the temperature, token ids and log-probs are forced.

Everything else (tools, stop, max_tokens, n, seed, extra vLLM fields) passes through; in train mode the output
constraints (tool_choice, strict tools, response_format, guided decoding) are then left out (call/free_sampling.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from services.proxy.errors import ProxyError

CHAT = "chat.completions"
COMPLETIONS = "completions"
MODES = ("train", "val")


@dataclass(frozen=True)
class RewriteSettings:
    model_name: str
    train_temperature: float | None
    val_temperature: float | None
    logprobs: bool = True
    completion_logprobs: int = 1


# How deep a body may nest: orjson writes at most 255 levels and reads at most 1,024.
MAX_DEPTH = 255


def dumps(value: Any, what: str) -> bytes:
    """orjson text of a body the proxy parsed; 400 when it nests deeper than JSON can be written back."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise ProxyError("invalid_request", f"{what} is nested more than {MAX_DEPTH} levels deep.") from None


def loads_lenient(data: bytes) -> Any:
    """JSON text parsed by the fast parser, then by json for what only json takes (NaN, Infinity). Raises
    ValueError for what neither takes, including text nested too deeply for json's recursion limit."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data)
        except RecursionError:
            raise ValueError("nested too deeply (orjson reads at most 1,024 levels)") from None


def parse_body(raw: bytes, *, lenient: bool = False) -> dict[str, Any]:
    """The JSON object of a request body (400 otherwise). Strict JSON: a model call with NaN or Infinity in it is
    refused here rather than forwarded changed. `lenient` also takes what Python's json does, so that an agent's
    event with a NaN reward gets the 422 that names the problem."""
    try:
        body = loads_lenient(raw) if lenient else orjson.loads(raw)
    except ValueError as err:  # orjson.JSONDecodeError and json.JSONDecodeError both are
        raise ProxyError("invalid_json", f"The body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ProxyError("invalid_json", "The body must be a JSON object.")
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(body: dict[str, Any], api: str) -> None:
    """Rejects field values the proxy cannot forward or record faithfully (400)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ProxyError("invalid_request", "`stream` must be a boolean.")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ProxyError("invalid_request", "`stream_options` must be an object.")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n < 1):
        raise ProxyError("invalid_request", "`n` must be a positive integer.")
    if api == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ProxyError("invalid_request", "`messages` must be a non-empty list.")
        if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
            raise ProxyError("invalid_request", "`logprobs` must be a boolean for chat completions.")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or not prompt:
            raise ProxyError("invalid_request", "`prompt` must be a non-empty string or list.")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not _is_int(logprobs) or logprobs < 0):
            raise ProxyError("invalid_request", "`logprobs` must be a non-negative integer for completions.")


# Train calls sample from the model's whole distribution at the forced temperature: that is the policy the trainer
# recomputes log-probs of (the PPO ratio's old policy). An agent's top_p/top_k/min_p, penalties or logit bias would
# reshape what the engine samples from, and the run would train off-policy without a sign; the model's own
# generation_config defaults (vLLM applies them to what a request leaves unset) would too, so the neutral values are
# sent, not just the agent's removed. Validation keeps the agent's settings (nothing is trained on it).
TRAIN_SAMPLING = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}


def rewrite(body: dict[str, Any], api: str, mode: str, settings: RewriteSettings, model: str = "") -> dict[str, Any]:
    """The body to send upstream (a new dict; `body` is left as it is), for `model` (the proxy's own when "")."""
    out = dict(body)
    out["model"] = model or settings.model_name
    temperature = settings.train_temperature if mode == "train" else settings.val_temperature
    if temperature is not None:
        out["temperature"] = temperature
    # Token ids in both modes, as v1.0's gateway forces them (its agents may decode `choices[].token_ids`, e.g. the
    # gsm8k example's CompletionAgent, also in validation); log-probs only for training.
    out["return_token_ids"] = True
    if mode == "train":
        out.update(TRAIN_SAMPLING)
        out.pop("logit_bias", None)
    if mode == "train" and settings.logprobs:
        if api == CHAT:
            out["logprobs"] = True
        else:
            out["logprobs"] = max(out.get("logprobs") or 0, settings.completion_logprobs)
    return out
