"""The triplet view: events trimmed to what training needs, one call per distinct prompt.

model_request keeps prompt/response token ids, response log-probs, model, version and status; reward keeps
value, source and reason; other events are left out. Of calls with an identical prompt-token sequence only
the last is kept (a retried or repeated call must not enter the batch twice). Log-probs that do not line up
with the response tokens, or are not finite, are dropped (has_response_logprobs false): never an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from services._gen.agl.v1 import event_pb2

from .validation import MODEL_REQUEST, REWARD


def _logprobs_ok(mr: event_pb2.ModelRequest) -> bool:
    logprobs = mr.response_logprobs
    if not mr.has_response_logprobs or len(logprobs) != len(mr.response_token_ids):
        return False
    return all(math.isfinite(x) for x in logprobs)


def trim(event: event_pb2.Event) -> event_pb2.Event | None:
    """The triplet form of one event, or None when the view leaves it out."""
    payload = event.WhichOneof("payload")
    out = event_pb2.Event(
        rollout_id=event.rollout_id,
        attempt_id=event.attempt_id,
        sequence=event.sequence,
        event_type=event.event_type,
        create_time=event.create_time,
        event_id=event.event_id,
    )
    if event.event_type == MODEL_REQUEST and payload == "model_request":
        src = event.model_request
        dst = out.model_request
        dst.prompt_token_ids.extend(src.prompt_token_ids)
        dst.response_token_ids.extend(src.response_token_ids)
        if _logprobs_ok(src):
            dst.response_logprobs.extend(src.response_logprobs)
            dst.has_response_logprobs = True
        dst.model = src.model
        dst.model_version = src.model_version
        dst.status = src.status
        dst.finish_reason = src.finish_reason
        return out
    if event.event_type == REWARD and payload == "reward":
        src_r = event.reward
        out.reward.value = src_r.value
        out.reward.source = src_r.source
        out.reward.reason = src_r.reason
        return out
    return None


def triplet_view(events: Iterable[event_pb2.Event]) -> list[event_pb2.Event]:
    """Trim `events` (in sequence order) and keep only the last call per identical prompt."""
    trimmed = [t for t in (trim(e) for e in events) if t is not None]
    last_by_prompt: dict[tuple[int, ...], int] = {}
    for pos, ev in enumerate(trimmed):
        if ev.WhichOneof("payload") == "model_request":
            last_by_prompt[tuple(ev.model_request.prompt_token_ids)] = pos
    keep = set(last_by_prompt.values())
    return [ev for pos, ev in enumerate(trimmed) if ev.WhichOneof("payload") != "model_request" or pos in keep]
