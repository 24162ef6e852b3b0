"""A resumed run goes on from its checkpoint exactly: the rollout manager's state goes back to what it was then.

The manager's own state file is always at its latest write, which may be ahead of the checkpoint a restarted
trainer loads: a trainer stopped after consuming step K+1 and before saving it had also drawn tasks for the groups
it created meanwhile (async mode keeps groups in flight across steps). The task loader resumes at the checkpoint's
position and draws those tasks again, so keeping the later state would train them twice, and drop the groups the
stopped pass consumed from training altogether.

So each checkpoint carries a copy of the manager's state (`RolloutManager.snapshot`, written before verl's
checkpoint is declared whole), and a trainer resuming from it rewinds the ledger to that copy before anything
runs:
* the rollouts of the groups in flight at the checkpoint stay (finished or not), and the feed delivers their
  terminal entries again from the copy's cursor (those received then are its `pending`);
* such a rollout that no longer exists (the stopped pass consumed it and its retention deleted it) is created
  again from its task, under its own id, and runs again;
* every other rollout of the run that is still queuing or running, or belongs to a step after the checkpoint, is
  deleted: the stopped pass made it, and the resumed pass makes its own, under the same ids when it draws the same
  task into the same slot.
Finished rollouts of steps up to the checkpoint that are in no group were consumed by saved steps: retention's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.trainer.rollouts.specs import LABEL_RUN, LABEL_STEP, LaunchSettings, Sample, build_specs
from services.trainer.rollouts.state import ManagerState

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "agl_manager_state.json"
_LIVE = (rollout_pb2.ROLLOUT_STATE_QUEUING, rollout_pb2.ROLLOUT_STATE_RUNNING)


@dataclass(frozen=True)
class Rewound:
    deleted: int
    recreated: int
    dropped_groups: int


def _step_label(rollout: rollout_pb2.Rollout) -> int:
    try:
        return int(rollout.metadata.labels.get(LABEL_STEP, "0") or 0)
    except ValueError:
        return 0


def _slot(group_id: str) -> int:
    """The slot in a group id `RUN-{kind}{step}-g{slot}` (services/trainer/specs.group_id)."""
    tail = group_id.rsplit("-", 1)[1]
    return int(tail[1:])


async def rewind(
    client: LedgerClient,
    run_id: str,
    snapshot: ManagerState,
    *,
    samples: Mapping[str, Sample],
    n: int,
    launch: LaunchSettings,
    create: Callable[[list[rollout_pb2.RolloutSpec]], Awaitable[object]],
) -> Rewound:
    """Makes the ledger agree with `snapshot` (the module's docstring), creating through `create` (the manager's,
    with its hooks and retries). The snapshot's groups whose task is no longer in `samples` (the data changed) are
    dropped from it."""
    step = snapshot.checkpoint_step
    listed = await client.list_rollouts(labels={LABEL_RUN: run_id})
    existing = {r.rollout_id for r in listed}
    dropped = [g for g in snapshot.groups.values() if any(i not in existing for i in g.rollout_ids)]
    dropped = [g for g in dropped if g.data_id not in samples]
    for record in dropped:
        log.warning("group %s: its task %s is no longer in the data; dropped", record.group_id, record.data_id)
        del snapshot.groups[record.group_id]
        for rollout_id in record.rollout_ids:
            snapshot.pending.pop(rollout_id, None)
    kept = {rollout_id for record in snapshot.groups.values() for rollout_id in record.rollout_ids}
    stale = [
        r.rollout_id for r in listed if r.rollout_id not in kept and (r.status.state in _LIVE or _step_label(r) > step)
    ]
    if stale:
        await client.delete_rollouts(stale)
    again: list[rollout_pb2.RolloutSpec] = []
    for record in snapshot.groups.values():
        missing = {i for i in record.rollout_ids if i not in existing}
        if not missing:
            continue
        is_train = record.kind == "s"
        specs = build_specs(
            run_id=run_id, step=record.step, slot=_slot(record.group_id), sample=samples[record.data_id],
            n=n if is_train else 1, launch=launch, is_train=is_train, kind=record.kind,
        )  # fmt: skip
        again.extend(s for s in specs if s.rollout_id in missing)
        for rollout_id in missing:
            snapshot.pending.pop(rollout_id, None)
    if again:
        await create(again)
    result = Rewound(deleted=len(stale), recreated=len(again), dropped_groups=len(dropped))
    # A warning when it undid something: what a stopped trainer had started is worth a line in the trainer's log.
    level = logging.WARNING if result.deleted or result.recreated or result.dropped_groups else logging.INFO
    log.log(
        level, "run %s rewound to the checkpoint of step %d: %d rollouts of later passes deleted, %d created again, "
        "%d groups in flight", run_id, step, result.deleted, result.recreated, len(snapshot.groups),
    )  # fmt: skip
    return result
