"""The rollout manager's small persisted state, so that a restarted manager resumes exactly.

* `cursor`: the highest terminal-log cursor received (the high-water mark).
* `pending`: rollouts received but not yet handed to the trainer, with their cursors. A restarted manager
  re-reads the log from the lowest of them and, up to `cursor`, accepts only these: nothing is missed
  and nothing already consumed is counted twice.
* `groups`: groups in flight (async carry-over survives a restart), `slots`: groups created per step,
  `to_delete`: consumed rollouts whose deletion has not been confirmed yet.
* `checkpoint_step`: in a copy saved with a checkpoint (RolloutManager.snapshot), the step it belongs to.

Written atomically (temporary file + rename) as JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class GroupRecord:
    group_id: str
    data_id: str
    step: int
    rollout_ids: list[str]
    # "s": a training group, "v": a validation group.
    kind: str = "s"


@dataclass
class ManagerState:
    cursor: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)
    to_delete: list[str] = field(default_factory=list)
    checkpoint_step: int = 0

    def resume_cursor(self) -> int:
        """Where the terminal stream must restart: before the oldest pending entry, else at the high-water mark."""
        if self.pending:
            return min(min(self.pending.values()) - 1, self.cursor)
        return self.cursor


def load_state(path: Path | None) -> ManagerState:
    if path is None or not path.exists():
        return ManagerState()
    raw = json.loads(path.read_text())
    return ManagerState(
        cursor=int(raw.get("cursor", 0)),
        pending={str(k): int(v) for k, v in raw.get("pending", {}).items()},
        groups={k: GroupRecord(**v) for k, v in raw.get("groups", {}).items()},
        slots={str(k): int(v) for k, v in raw.get("slots", {}).items()},
        to_delete=[str(x) for x in raw.get("to_delete", [])],
        checkpoint_step=int(raw.get("checkpoint_step", 0)),
    )


def save_state(path: Path | None, state: ManagerState) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    payload = {
        "cursor": state.cursor,
        "pending": state.pending,
        "groups": {k: asdict(v) for k, v in state.groups.items()},
        "slots": state.slots,
        "to_delete": state.to_delete,
        "checkpoint_step": state.checkpoint_step,
    }
    tmp.write_text(json.dumps(payload, separators=(",", ":")))
    os.replace(tmp, path)
