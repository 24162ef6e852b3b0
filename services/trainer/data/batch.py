"""Rows -> verl DataProto with the tensors verl's actor expects.

Layout (B rows, P = prompt length, R = response length, both fixed by the config):

* `prompts` (B, P): left-padded; `responses` (B, R): right-padded; `input_ids` = prompts ++ responses.
* `attention_mask` (B, P+R): 1 on every real token (context tokens inside a trajectory included);
  `position_ids` = cumsum(attention_mask) - 1, clipped at 0 (verl's convention).
* `response_mask` (B, R): 1 on tokens the model generated, 0 on context and padding.
* `token_level_scores` / `token_level_rewards` (B, R): the rollout's reward at the row's last response token.
* `advantages` / `returns` (B, R): the rollout's scalar advantage times response_mask.
* `rollout_log_probs` (B, R): engine log-probs (0 on context), when at least one row has aligned log-probs.
  Rows without them (an engine that returned none, a call whose log-probs did not align) are 0 there and
  flagged in `agl_rollout_log_probs_missing` (B,) bool: `correction.apply_rollout_correction` copies the
  recomputed old log-probs into those rows (ratio 1: treated as on-policy) and drops the flag before the
  update, so one such row no longer costs the whole batch its importance weights.
* non-tensor: `uid` and `data_id` (the group / sample), `rollout_id`, `turn_index`, `num_turns`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto

from services.trainer.data.aggregation import Row

# Per-row flag (B,) bool: this row's `rollout_log_probs` are a placeholder (the engine gave none).
MISSING_ROLLOUT_LOG_PROBS_KEY = "agl_rollout_log_probs_missing"


def _scatter(rows_values: list[list[Any]], lengths: np.ndarray, width: int, left: bool, out: np.ndarray) -> None:
    """Writes each row's values into out (B, width), left- or right-aligned, with one vectorised copy."""
    flat: list[Any] = []
    for values in rows_values:
        flat.extend(values)
    if not flat:
        return
    data = np.asarray(flat, dtype=out.dtype)
    starts = np.arange(len(lengths), dtype=np.int64) * width + ((width - lengths) if left else 0)
    offsets = np.cumsum(lengths) - lengths
    index = np.repeat(starts - offsets, lengths) + np.arange(len(data), dtype=np.int64)
    out.reshape(-1)[index] = data


def rows_to_dataproto(
    rows: Sequence[Row],
    advantages: Mapping[str, float],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int = 0,
) -> DataProto:
    """Packs rows (already within the limits) into a DataProto."""
    b, p, r = len(rows), prompt_length, response_length
    prompt_lengths = np.fromiter((len(row.prompt_ids) for row in rows), dtype=np.int64, count=b)
    response_lengths = np.fromiter((len(row.response_ids) for row in rows), dtype=np.int64, count=b)
    for row, n_prompt, n_response in zip(rows, prompt_lengths, response_lengths, strict=True):
        if n_prompt > p or n_response > r or n_prompt == 0 or n_response == 0:
            raise ValueError(
                f"row of rollout {row.rollout_id} has prompt {n_prompt} / response {n_response} tokens; "
                f"limits are 1..{p} / 1..{r}"
            )
    prompts = np.full((b, p), pad_token_id, dtype=np.int64)
    responses = np.full((b, r), pad_token_id, dtype=np.int64)
    response_mask = np.zeros((b, r), dtype=np.int64)
    _scatter([row.prompt_ids for row in rows], prompt_lengths, p, True, prompts)
    _scatter([row.response_ids for row in rows], response_lengths, r, False, responses)
    _scatter([row.response_mask for row in rows], response_lengths, r, False, response_mask)
    prompt_attention = (np.arange(p)[None, :] >= (p - prompt_lengths)[:, None]).astype(np.int64)
    response_attention = (np.arange(r)[None, :] < response_lengths[:, None]).astype(np.int64)
    scores = np.zeros((b, r), dtype=np.float32)
    rewards = np.fromiter((row.reward for row in rows), dtype=np.float32, count=b)
    scores[np.arange(b), response_lengths - 1] = rewards
    row_advantage = np.fromiter((advantages[row.rollout_id] for row in rows), dtype=np.float32, count=b)[:, None]
    logprobs = None
    missing = np.fromiter((row.logprobs is None for row in rows), dtype=bool, count=b)
    if not missing.all():
        present = np.flatnonzero(~missing)
        known = np.zeros((len(present), r), dtype=np.float32)
        _scatter([rows[i].logprobs for i in present], response_lengths[present], r, False, known)  # type: ignore[misc]
        logprobs = np.zeros((b, r), dtype=np.float32)
        logprobs[present] = known

    attention = torch.from_numpy(np.concatenate([prompt_attention, response_attention], axis=1))
    # cumsum(attention) - 1 clipped at 0, in closed form: left padding then one contiguous run of tokens.
    positions = np.arange(p + r, dtype=np.int64)[None, :] - (p - prompt_lengths)[:, None]
    positions = np.clip(positions, 0, (prompt_lengths + response_lengths - 1)[:, None])
    mask = torch.from_numpy(response_mask)
    advantage = torch.from_numpy(row_advantage) * mask.to(torch.float32)
    tensors: dict[str, torch.Tensor] = {
        "prompts": torch.from_numpy(prompts),
        "responses": torch.from_numpy(responses),
        "input_ids": torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        "attention_mask": attention,
        "position_ids": torch.from_numpy(positions),
        "response_mask": mask,
        "token_level_scores": torch.from_numpy(scores),
        "token_level_rewards": torch.from_numpy(scores.copy()),
        "advantages": advantage,
        "returns": advantage.clone(),
    }
    if logprobs is not None:
        tensors["rollout_log_probs"] = torch.from_numpy(logprobs)
        if missing.any():
            tensors[MISSING_ROLLOUT_LOG_PROBS_KEY] = torch.from_numpy(missing)
    groups = np.array([row.group_id for row in rows], dtype=object)
    non_tensors = {
        "uid": groups,
        "data_id": np.array([row.data_id for row in rows], dtype=object),
        "rollout_id": np.array([row.rollout_id for row in rows], dtype=object),
        "turn_index": np.array([row.turn_index for row in rows], dtype=np.int64),
        "num_turns": np.array([row.num_turns for row in rows], dtype=np.int64),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
