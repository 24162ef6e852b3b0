"""A claim the ledger applied but whose answer never reached the controller (the ledger went away in between): the
controller cannot know it holds the rollout, so its retry must claim with the same attempt; with a new one the
rollout stayed running an attempt nobody ran, and the trainer waiting on it waited for ever (seen in a kill -9 test
of the whole stack). Real ledger and controller; a TCP relay between them loses the answer."""

from __future__ import annotations

import sys
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from tests.controller.conftest import Stack, run_controller, spec, wait_for
from tests.support.relay import cutting_relay


async def test_a_claim_whose_answer_was_lost_still_runs_its_rollout_under_the_claimed_attempt(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with (
        cutting_relay(stack.ledger.address) as relay,
        run_controller(stack, tmp_path, ledger_address=relay.address) as controller,
    ):
        rollout = spec(command=[sys.executable, "-c", "print('done')"], timeout_s=60)
        relay.silence_after(rollout.rollout_id.encode())
        await ledger.create_rollouts([rollout])
        # The ledger applied the claim (its answer is held back): now the ledger goes away, for longer than the
        # client's own retries of the claim and of its re-read, so the claim's state stays unknown.
        await wait_for(ledger, [rollout.rollout_id], states=(rollout_pb2.ROLLOUT_STATE_RUNNING,), timeout_s=30)
        relay.cut(down_s=4.0)
        done = await wait_for(ledger, [rollout.rollout_id], timeout_s=60)
        log = controller.process.log_text()
    assert relay.cuts == 1
    assert "state unknown" in log, log[-3000:]  # the path under test was taken
    status = done[rollout.rollout_id].status
    assert status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, (status, log[-3000:])
    # The attempt that ran is the one whose claim's answer was lost, confirmed by reading the rollout back.
    assert f"claimed (attempt {status.attempt_id}, confirmed on re-read)" in log, log[-3000:]
