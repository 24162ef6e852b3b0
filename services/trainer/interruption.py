"""Ctrl-C and SIGTERM of agl-trainer: the run stops at once, is on record as interrupted, and leaves no pause.

The driver spends its life in `ray.get` on verl's task runner, where an exception raised by a signal handler
surfaces as a SystemError from Ray's Cython code. So the handler does the stop itself and ends the process:
1. it kills the Ray cluster the driver started (services/trainer/run/fate.py), at once. Ray's own shutdown after a
   signal prints stack dumps, and its task runner goes on training meanwhile; a kill is safe to resume from, since
   verl names a checkpoint the latest only once it is whole, and the rollouts left behind are the resume's to
   reuse (its step's groups are in the manager's state) or to delete (groups of other steps);
2. it marks the run failed in the ledger ("interrupted by SIGINT after step N") and lifts a proxy pause this run
   holds (a stop mid-update leaves one; its lease would lift it later, the next start at once);
3. it prints one line and exits 128 + the signal's number, without Ray's exit hooks (their cluster is gone).
A second signal meanwhile is ignored: the stop is bounded by the ledger calls' timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from services.trainer.config import TrainerSettings
from services.trainer.rollouts.datasets import last_checkpoint

SIGNALS = (signal.SIGINT, signal.SIGTERM)
LEDGER_TIMEOUT_S = 10.0


def on_signals(settings: TrainerSettings, checkpoint_dir: str | Path) -> None:
    """From now on SIGINT and SIGTERM stop this driver as the module's docstring says."""

    def handler(signum: int, frame: FrameType | None) -> None:
        code = stop(settings, signal.Signals(signum), checkpoint_dir, sys.__stderr__ or sys.stderr)
        os._exit(code)

    for sig in SIGNALS:
        signal.signal(sig, handler)


@contextlib.contextmanager
def after_ray_init(settings: TrainerSettings, checkpoint_dir: str | Path) -> Iterator[None]:
    """Within it, every ray.init is followed by on_signals (ray.init replaces the SIGTERM handler)."""
    import ray

    if ray.is_initialized():
        on_signals(settings, checkpoint_dir)
    original = ray.init

    @functools.wraps(original)
    def init_then_on_signals(*args: Any, **kwargs: Any) -> Any:
        context = original(*args, **kwargs)
        on_signals(settings, checkpoint_dir)
        return context

    ray.init = init_then_on_signals
    try:
        yield
    finally:
        ray.init = original


async def record(ledger_address: str, key: str | None, run_id: str, why: str) -> tuple[int, bool]:
    """Marks the run failed with `why` and lifts the pause the run holds: (the last step reported, -1 for a run not
    on record; pause lifted)."""
    from services.client import LedgerClient, NotFound
    from services.trainer.run.progress import finish_run

    owner = f"trainer:{run_id}"
    async with LedgerClient(ledger_address, key) as client:
        try:
            steps = await client.list_run_steps(run_id, metric_names=["training/global_step"])
        except NotFound:
            last = -1  # stopped before the run was on record: nothing to mark
        else:
            last = max((s.step for s in steps), default=0)
            await finish_run(client, run_id, f"interrupted by {why} after step {last}")
        control = await client.get_proxy_control()
        lifted = control.paused and control.owner == owner
        if lifted:
            await client.set_proxy_pause(False, reason=f"trainer {run_id} interrupted by {why}")
    return last, lifted


def stop(settings: TrainerSettings, sig: signal.Signals, checkpoint_dir: str | Path, out: TextIO) -> int:
    """What the interrupted driver does (the module's docstring); returns the exit code."""
    from services.trainer.run import fate

    for other in SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    fate.kill_cluster()
    # Ray's log streaming prints what its dying processes wrote: this process's output is muted from here on.
    with contextlib.suppress(OSError):
        devnull = open(os.devnull, "w")  # noqa: SIM115 (open for the rest of the process)
        sys.stdout = sys.stderr = devnull
    why = sig.name
    try:
        last, lifted = asyncio.run(
            asyncio.wait_for(record(settings.ledger_address, settings.key, settings.run_id, why), LEDGER_TIMEOUT_S)
        )
        ledger = "the run is marked interrupted in the ledger" if last >= 0 else "the run was not on record yet"
        ledger += ", the proxies resumed" if lifted else ""
    except Exception as err:  # the ledger is down or slow: the stop still ends here, and says so
        last, ledger = 0, f"the ledger could not be told ({type(err).__name__}: {err})"
    checkpoint = last_checkpoint(checkpoint_dir)
    resume = f"from the checkpoint of step {checkpoint}" if checkpoint else "from the start (no checkpoint yet)"
    step = f" after step {last}" if last > 0 else ""
    out.write(f"agl-trainer: interrupted by {why}{step}; {ledger}. The same command resumes {resume}.\n")
    out.flush()
    return 128 + int(sig)
