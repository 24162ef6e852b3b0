"""How old the weights were that sampled each trained token, and the bound on it (agl.async_training.max_staleness).

In asynchronous training a group can finish steps after it started: its calls were sampled by the weights of an
earlier step, and verl's rollout correction weighs those tokens by the ratio of the trainer's log-probs to the
engine's. The ratio is truncated, so a token far behind the policy carries a biased, noisy gradient; the bound keeps
such tokens out of the loss. The lag of a token is the version of the weights being updated (the step whose
update the engines serve) minus the version that sampled it (the `model_version` the proxy recorded on its call).

The rule: a generated token whose lag is above max_staleness is masked out of the loss and stays in its row as
context (the row's later calls saw it); a row left with no trained token is dropped, and a rollout left with no
row leaves its group, as a killed rollout does (its reward no longer counts in the group's baseline). Masking
rather than dropping keeps multi-turn rows whole: a trajectory whose first calls are old still trains its recent
ones. Counted in agl/async/stale_tokens_masked and agl/async/stale_rows_dropped.

The metrics describe the tokens that are trained (after the rule), per token: agl/async/staleness_mean,
staleness_max, staleness_p90, and stale_token_fraction (lag above 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.trainer.data.aggregation import Row


@dataclass(frozen=True)
class StalenessOutcome:
    rows: list[Row]
    metrics: dict[str, float]


def _lags(row: Row, weights_version: int) -> list[int] | None:
    """Each response token's lag (None for context tokens); None for a row built without versions."""
    if len(row.versions) != len(row.response_ids):
        return None
    return [max(weights_version - v, 0) if m else -1 for v, m in zip(row.versions, row.response_mask, strict=True)]


def bound_staleness(rows: Sequence[Row], weights_version: int, max_staleness: int | None) -> StalenessOutcome:
    """Applies the bound (None: no bound) to rows in place of their masks; returns the rows kept and the metrics."""
    kept: list[Row] = []
    masked = dropped = 0
    trained: list[int] = []
    for row in rows:
        lags = _lags(row, weights_version)
        if lags is None:
            kept.append(row)
            trained.extend(0 for m in row.response_mask if m)
            continue
        if max_staleness is not None:
            for i, lag in enumerate(lags):
                if lag > max_staleness:
                    row.response_mask[i] = 0
                    masked += 1
            # A row now ending in context would train nothing there: trimmed, as the length limit trims.
            row.cut(len(row.response_ids))
            del lags[len(row.response_ids) :]
            if not row.response_mask:
                dropped += 1
                continue
        kept.append(row)
        trained.extend(lag for lag, m in zip(lags, row.response_mask, strict=True) if m)
    trained.sort()
    metrics = {
        "agl/async/weights_version": float(weights_version),
        "agl/async/staleness_mean": sum(trained) / len(trained) if trained else 0.0,
        "agl/async/staleness_max": float(trained[-1]) if trained else 0.0,
        "agl/async/staleness_p90": float(trained[min(int(0.9 * len(trained)), len(trained) - 1)]) if trained else 0.0,
        "agl/async/stale_token_fraction": sum(lag > 0 for lag in trained) / len(trained) if trained else 0.0,
        "agl/async/stale_tokens_masked": float(masked),
        "agl/async/stale_rows_dropped": float(dropped),
    }
    return StalenessOutcome(kept, metrics)
