"""Issue 30 finding 11 through the real stack (ledger, proxy, local controller, the installed `agl`): what an agent
prints or posts (terminal escapes, BEL, line breaks) is escaped in the controller's log and in `agl rollout`'s
output, so it can neither act on the operator's terminal nor forge a line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient

from .conftest import KEY, Stack, run_controller, spec, wait_for

FAILED = rollout_pb2.ROLLOUT_STATE_FAILED
NASTY = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
FORGED = "2026-12-02 04:00:00,000 INFO services.controller.core.controller rollout x: succeeded"

# Posts a reward whose message holds escapes and a forged line, prints the same, then fails with a last line of it.
AGENT = f"""
import json, os, sys, urllib.request
message = {NASTY + "ok" + chr(10) + FORGED!r}
body = json.dumps({{"event_type": "reward", "data": {{"value": 0.5, "message": message, "source": "probe"}}}})
request = urllib.request.Request(os.environ["AGL_EVENT_URL"], data=body.encode(), method="POST",
    headers={{"Authorization": "Bearer " + os.environ["AGL_KEY"], "Content-Type": "application/json"}})
urllib.request.urlopen(request, timeout=30).read()
print(message, flush=True)
print({NASTY + "last words"!r}, flush=True)
sys.exit(3)
"""


def _agl(*args: str, ledger: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env.update({"AGL_LEDGER_ADDR": ledger, "AGL_KEY": KEY})
    agl = str(Path(sys.executable).parent / "agl")
    done = subprocess.run([agl, *args], capture_output=True, text=True, env=env, timeout=60, check=True)
    return done.stdout


def _unsafe(text: str) -> list[str]:
    return [hex(ord(c)) for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]


async def test_agent_escapes_and_line_breaks_are_escaped_in_the_log_and_agl_rollout(
    stack: Stack, ledger: LedgerClient, tmp_path: Path
) -> None:
    with run_controller(stack, tmp_path) as controller:
        [created] = await ledger.create_rollouts([spec(command=[sys.executable, "-c", AGENT], timeout_s=60)])
        rollout = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
        assert rollout.status.state == FAILED
        log = controller.process.log_text()
    assert _unsafe(log) == [], _unsafe(log)
    assert not any(line.startswith(FORGED) for line in log.splitlines()), log
    failed = [line for line in log.splitlines() if created.rollout_id in line and "exited with code 3" in line]
    assert failed and "\\x1b]0;pwned\\x07" in failed[-1], log

    shown = _agl("rollout", created.rollout_id, ledger=stack.ledger.address)
    assert _unsafe(shown) == [], _unsafe(shown)
    assert not any(line.startswith(FORGED) for line in shown.splitlines()), shown
    [reward] = [line for line in shown.splitlines() if line.startswith("-- reward")]
    assert "\\x1b]0;pwned\\x07" in reward and "\\x0a" + FORGED in reward, reward
    watched = _agl("rollouts", "--state", "failed", ledger=stack.ledger.address)
    assert _unsafe(watched) == [], _unsafe(watched)
