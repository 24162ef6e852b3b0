"""Small agent programs for the local runner tests, run as `python tests/controller/agents/tools.py MODE ...`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def spawn_family(pid_file: str) -> None:
    """Starts children that ignore SIGTERM (one with a grandchild), records every pid, then hangs."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]),
        subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 600 & sleep 600; wait"]),
    ]
    shell = children[1].pid
    grandchildren: list[int] = []
    deadline = time.monotonic() + 10
    while not grandchildren and time.monotonic() < deadline:  # wait for the shell's own child
        time.sleep(0.05)
        with contextlib.suppress(OSError):
            grandchildren = [int(p) for p in Path(f"/proc/{shell}/task/{shell}/children").read_text().split()]
    pids = [os.getpid(), *(child.pid for child in children), *grandchildren]
    # The PID namespace the pids belong to (a contained agent's own): the test maps them to the host's.
    Path(pid_file + ".ns").write_text(os.readlink("/proc/self/ns/pid"))
    Path(pid_file + ".tmp").write_text(" ".join(map(str, pids)))
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(600)


def count_running(directory: str, marker: str) -> None:
    """Notes how many agents run at once: a file per running agent in `directory`."""
    folder = Path(directory)
    mine = folder / f"{marker}.running"
    mine.touch()
    running = len(list(folder.glob("*.running")))
    with open(folder / "counts.txt", "a") as out:
        out.write(f"{marker} {running}\n")
    time.sleep(0.3)
    mine.unlink()


def flaky(directory: str) -> None:
    """One model call and a reward through the proxy; the first attempt (no `first.json` in `directory` yet) then
    records its pid and environment and hangs until killed, later attempts exit 0 once `release` exists."""
    import httpx

    base, events, key = (os.environ[k] for k in ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"))
    first = Path(directory) / "first.json"
    is_first = not first.exists()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=30, headers=headers) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "attempt"}], "max_tokens": 4}
        http.post(f"{base}/chat/completions", json=body).raise_for_status()
        value = 0.0 if is_first else 1.0
        http.post(events, json={"event_type": "reward", "data": {"value": value}}).raise_for_status()
    if is_first:
        import json

        env = {k: v for k, v in os.environ.items() if k.startswith("AGL_")}
        record = {"pid": os.getpid(), "ns": os.readlink("/proc/self/ns/pid"), "env": env}  # the pid is the namespace's
        Path(f"{first}.tmp").write_text(json.dumps(record))
        os.replace(f"{first}.tmp", first)
        time.sleep(600)
    release = Path(directory) / "release"
    while not release.exists():  # the test acts while this attempt runs, then lets it end
        time.sleep(0.02)
    print("second attempt done", flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "family":
        spawn_family(*args)
    elif mode == "count":
        count_running(*args)
    elif mode == "flaky":
        flaky(*args)
    elif mode == "hang":
        print("hanging", flush=True)
        time.sleep(600)
    elif mode == "exit":
        print("something went wrong: giving up", flush=True)
        sys.exit(int(args[0]))
    else:
        sys.exit(f"unknown mode {mode}")
