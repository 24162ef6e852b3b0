"""Training progress in the ledger: the run and one record of named metrics per step.

What the trainer reports here outlives the rollouts it consumed (they may be deleted), so `agl run ID` and the
console show a run's curves from the ledger alone. Every call is safe to repeat: starting a run that exists
reopens it, and reporting a step again merges its metrics. Values that are not finite numbers (NaN, inf, lists,
strings) are dropped, since the ledger refuses them; names are kept as verl writes them ("agl/rollout/succeeded",
"val/agl/reward_mean", "timing_s/gen").
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient

log = logging.getLogger(__name__)


def _config_text(config_summary: Mapping[str, Any] | str | None) -> str:
    if config_summary is None:
        return ""
    if isinstance(config_summary, str):
        return config_summary
    return json.dumps(config_summary, default=str, sort_keys=True)


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are finite real numbers (Python, numpy or one-element torch values), as floats."""
    kept: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, (str, bytes)) or not name:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            kept[str(name)] = number
    return kept


async def start_run(
    client: LedgerClient,
    run_id: str,
    labels: Mapping[str, str] | None = None,
    config_summary: Mapping[str, Any] | str | None = None,
) -> run_pb2.Run:
    """Create the run (or reopen it when a resumed trainer starts it again) and return it."""
    run, created = await client.create_run(run_id, labels, _config_text(config_summary))
    if not created and run.state != run_pb2.RUN_STATE_RUNNING:
        run = await client.update_run_state(run_id, run_pb2.RUN_STATE_RUNNING)
    log.info("run %s %s in the ledger", run_id, "created" if created else "reopened")
    return run


async def report_step(client: LedgerClient, run_id: str, step: int, metrics: Mapping[str, Any]) -> int:
    """Store one step's metrics (merged into what the step had); returns how many metrics were kept."""
    kept = finite_metrics(metrics)
    dropped = len(metrics) - len(kept)
    if dropped:
        log.debug("run %s step %d: %d metrics were not finite numbers and were left out", run_id, step, dropped)
    await client.report_run_steps(run_id, {step: kept})
    return len(kept)


async def finish_run(client: LedgerClient, run_id: str, error: str | None = None) -> run_pb2.Run:
    """Mark the run SUCCEEDED, or FAILED with `error`."""
    state = run_pb2.RUN_STATE_FAILED if error else run_pb2.RUN_STATE_SUCCEEDED
    return await client.update_run_state(run_id, state, error or "")
