"""Mini-batch alignment: choose which rows of a step batch to train on.

verl splits the batch into mini-batches of a fixed number of rows, one optimiser update each. The number
of rows a step produces varies (calls per rollout, breaks, drops), so the batch is cut to a whole number
of mini-batches, at most `max_ppo_update_times` of them. Rows of zero-variance groups (every rollout got
the same reward, so the advantage is zero) are dropped first, then random rows. Pure.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Alignment:
    keep: list[int]
    num_updates: int
    mini_batch_rows: int
    dropped_zero_variance_rows: int
    dropped_random_rows: int


def align_rows(
    group_ids: Sequence[str],
    zero_variance: set[str],
    *,
    mini_batch_rows: int,
    max_updates: int,
    divisor: int,
    rng: random.Random,
) -> Alignment:
    """Indices to keep (ascending), the number of updates and the mini-batch size in rows.

    mini_batch_rows <= 0 means one mini-batch of all rows. `divisor` (the data-parallel size times verl's fixed
    micro-batch sizes, config.row_divisor) divides every mini-batch: a mini-batch size it does not divide is rounded
    down to a multiple of it, and when fewer rows than one mini-batch remain, the step trains one smaller
    mini-batch rounded down to a multiple of it.
    max_updates <= 0 means no cap. keep is empty when fewer than `divisor` rows exist.
    """
    total = len(group_ids)
    divisor = max(divisor, 1)
    if mini_batch_rows <= 0:
        mini_batch_rows = total
    elif mini_batch_rows % divisor:
        mini_batch_rows = max(mini_batch_rows // divisor, 1) * divisor
    updates = total // mini_batch_rows if mini_batch_rows else 0
    if updates >= 1:
        if max_updates > 0:
            updates = min(updates, max_updates)
        target = updates * mini_batch_rows
    else:
        updates = 1
        target = (total // divisor) * divisor
        mini_batch_rows = target
    if target <= 0:
        return Alignment([], 0, 0, 0, 0)

    excess = total - target
    dropped: set[int] = set()
    groups = sorted({g for g in group_ids if g in zero_variance})
    rng.shuffle(groups)
    order = {g: i for i, g in enumerate(groups)}
    zero_rows = sorted((i for i, g in enumerate(group_ids) if g in order), key=lambda i: (order[group_ids[i]], i))
    for index in zero_rows[:excess]:
        dropped.add(index)
    dropped_zero = len(dropped)
    if excess > dropped_zero:
        remaining = [i for i in range(total) if i not in dropped]
        dropped.update(rng.sample(remaining, excess - dropped_zero))
    keep = [i for i in range(total) if i not in dropped]
    return Alignment(keep, updates, mini_batch_rows, dropped_zero, excess - dropped_zero)
