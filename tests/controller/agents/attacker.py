"""An agent that tries to break out of its rollout (tests/controller/test_containment.py).

Runs as an agent class (`tests.controller.agents.attacker:AttackAgent`, warm or fresh) or as a command
(`python tests/controller/agents/attacker.py`); what it tries is named by ATTACK:

- `secrets`: reads every /proc/*/environ and /proc/*/cmdline it can (its ancestors', the controller's at
  CONTROLLER_PID, the ledger's), collects every AGL_KEY value and every `--key`/`--key=` argument that is not its own
  token, and calls the ledger's ListRollouts at LEDGER_ADDR with each;
- `peek`: reads the file at PEEK_PATH (another rollout's log) and every other agent's AGL_KEY it can find in /proc;
- `escape`: starts a `setsid` sleeper (and a double-forked one) whose command line carries MARKER, then hangs
  (or, with THEN_EXIT set, ends).

It prints one line `ATTACK {json}` with what it found, which the test reads from the rollout's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _ancestors() -> list[int]:
    pids, pid = [], os.getpid()
    while pid > 1:
        status = _read(f"/proc/{pid}/status") or b""
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith(b"PPid:")), 0)
        if ppid <= 0:
            break
        pids.append(ppid)
        pid = ppid
    return pids


def _keys_in(pid: str) -> set[str]:
    """AGL_KEY values in the process's environment and --key values on its command line."""
    found: set[str] = set()
    for entry in (_read(f"/proc/{pid}/environ") or b"").split(b"\0"):
        if entry.startswith(b"AGL_KEY="):
            found.add(entry[len(b"AGL_KEY=") :].decode(errors="replace"))
    argv = (_read(f"/proc/{pid}/cmdline") or b"").split(b"\0")
    for i, arg in enumerate(argv):
        if arg == b"--key" and i + 1 < len(argv):
            found.add(argv[i + 1].decode(errors="replace"))
        elif arg.startswith(b"--key="):
            found.add(arg[len(b"--key=") :].decode(errors="replace"))
    return found


def _all_keys() -> dict[str, list[str]]:
    """Every key this process can read in /proc, by the pid it came from (its own token left out)."""
    own = os.environ.get("AGL_KEY", "")
    pids = {str(pid) for pid in _ancestors()}
    pids |= {entry for entry in os.listdir("/proc") if entry.isdigit()}
    if os.environ.get("CONTROLLER_PID"):
        pids.add(os.environ["CONTROLLER_PID"])
    found: dict[str, list[str]] = {}
    for pid in sorted(pids):
        for key in _keys_in(pid) - {own, ""}:
            found.setdefault(key, []).append(pid)
    return found


async def _ledger_accepts(address: str, keys: list[str]) -> list[str]:
    """The keys with which the ledger answered ListRollouts."""
    from services.client import LedgerClient, LedgerError

    accepted = []
    for key in keys:
        try:
            async with LedgerClient(address, key) as client:
                await client.list_rollouts()
            accepted.append(key)
        except LedgerError:
            continue
    return accepted


def secrets() -> dict[str, object]:
    found = _all_keys()
    accepted = asyncio.run(_ledger_accepts(os.environ["LEDGER_ADDR"], sorted(found)))
    return {"found": sorted(found), "ledger_accepted": accepted, "ancestors": _ancestors()}


def peek() -> dict[str, object]:
    content = _read(os.environ["PEEK_PATH"])
    return {"read": content is not None, "content": (content or b"").decode(errors="replace"), "keys": _all_keys()}


def escape() -> dict[str, object]:
    marker = os.environ["MARKER"]
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)", marker]
    subprocess.Popen(sleeper, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    daemon = f"import os, subprocess; os.setsid(); subprocess.Popen({sleeper!r}); os._exit(0)"
    subprocess.run([sys.executable, "-c", daemon], check=True)
    return {"escaped": True}


def attack() -> None:
    what = os.environ["ATTACK"]
    result = {"secrets": secrets, "peek": peek, "escape": escape}[what]()
    print("ATTACK " + json.dumps(result), flush=True)
    if (what == "escape" and not os.environ.get("THEN_EXIT")) or os.environ.get("HOLD"):
        time.sleep(600)


class AttackAgent:
    def run(self) -> None:
        attack()


if __name__ == "__main__":
    attack()
