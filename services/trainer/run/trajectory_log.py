"""What the agents actually said: every consumed rollout as one JSON line with its decoded text.

The ledger keeps consumed rollouts only for the last `agl.retention.keep_steps` steps (it stays bounded), so
this file is where a user reads the conversations of every step trained on: per rollout its step, group, task
input, reward and, per model call, the prompt and the response decoded with the model's tokenizer, the token
counts and the weight version that answered. Validation calls carry no token ids: their prompt (the request's
messages) and response (the answer's message) come from the full recorded call instead (`RolloutTrace.call_texts`,
read by the manager when this log is on). Enabled by `agl.trajectory_log` (a path); off by default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.trainer.data.triplets import CallText, RolloutTrace

Decode = Callable[[Sequence[int]], str]


def trajectory_records(
    step: int, traces: Sequence[RolloutTrace], decode: Decode, inputs: Mapping[str, Any], kind: str = "train"
) -> list[dict[str, Any]]:
    records = []
    for trace in traces:
        if trace.call_texts is not None:
            calls = [_text_record(c) for c in trace.call_texts]
        else:
            calls = [
                {
                    "prompt": decode(t.prompt_ids),
                    "response": decode(t.response_ids),
                    "prompt_tokens": len(t.prompt_ids),
                    "response_tokens": len(t.response_ids),
                    "model_version": t.model_version,
                }
                for t in trace.triplets
            ]
        records.append(
            {
                "step": step,
                "kind": kind,
                "rollout_id": trace.rollout_id,
                "group_id": trace.group_id,
                "data_id": trace.data_id,
                "input": inputs.get(trace.data_id),
                "reward": trace.reward,
                "reward_missing": trace.reward_missing,
                "succeeded": trace.succeeded,
                **(
                    {"failure_reason": trace.failure_reason, "error": trace.error_message}
                    if not trace.succeeded
                    else {}
                ),
                "calls": calls,
            }
        )
    return records


def _text_record(call: CallText) -> dict[str, Any]:
    record: dict[str, Any] = {
        "prompt": call.prompt,
        "response": call.response,
        "prompt_tokens": call.prompt_tokens,
        "response_tokens": call.response_tokens,
        "model_version": call.model_version,
        "finish_reason": call.finish_reason,
    }
    if not call.ok:
        record["failed"] = True
    return record


class TrajectoryLog:
    """Appends records to a JSONL file (created with its folder)."""

    def __init__(self, path: Path | str, decode: Decode, inputs: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._decode = decode
        self._inputs = inputs

    def forget_after(self, step: int) -> int:
        """Drops the records of steps after `step` (and a line cut short by a kill); how many were dropped.

        A trainer resumed from the checkpoint of `step` redoes the later steps: the records of their first pass
        (a trainer stopped after writing them, before its checkpoint) would otherwise stand beside the redo's."""
        if not self.path.exists():
            return 0
        kept: list[str] = []
        dropped = 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record_step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                record_step = None
            if record_step is None or record_step > step:
                dropped += 1
            else:
                kept.append(line + "\n")
        if dropped:
            partial = self.path.with_name(self.path.name + ".tmp")
            partial.write_text("".join(kept), encoding="utf-8")
            os.replace(partial, self.path)
        return dropped

    def write(self, step: int, traces: Sequence[RolloutTrace], kind: str = "train") -> int:
        records = trajectory_records(step, traces, self._decode, self._inputs, kind)
        with self.path.open("a", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        return len(records)
