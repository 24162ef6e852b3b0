"""services/trainer/run/fate.py: what a trainer's driver started dies with it, however the driver dies; nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.trainer.run import fate

# A driver as agl-trainer's: it shares its fate, then starts processes the way Ray does (its head processes, a
# worker in a session of its own that starts a child of its own, a raylet-like helper whose own child shows no
# token, as Ray's agents do once setproctitle has written over their environment), prints their pids and waits.
DRIVER = """
import os, subprocess, sys, time
from services.trainer.run.fate import share_fate
watchdog = share_fate()
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
head = subprocess.Popen(sleeper)
worker = subprocess.Popen(
    [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)", *sleeper],
    start_new_session=True,
)
spawn_tokenless = (
    "import subprocess, sys, time; print(subprocess.Popen(sys.argv[1:], env={}).pid, flush=True); time.sleep(600)"
)
helper = subprocess.Popen([sys.executable, "-c", spawn_tokenless, *sleeper], stdout=subprocess.PIPE, text=True)
agent = int(helper.stdout.readline())
print(watchdog.pid, head.pid, worker.pid, helper.pid, agent, flush=True)
if sys.argv[1] == "exit":
    time.sleep(1)
    os._exit(0)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _start(how: str) -> tuple[subprocess.Popen[str], list[int]]:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, how], stdout=subprocess.PIPE, text=True, env=env, cwd=repo)
    assert driver.stdout is not None
    pids = [int(p) for p in driver.stdout.readline().split()]
    assert len(pids) == 5, pids
    # The worker's own child is found by the token, not by any parent or group.
    deadline = time.monotonic() + 10
    while len(fate.processes_with(_token(pids[1]))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    return driver, pids


def _token(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    entry = next(e for e in environ if e.startswith(fate.TOKEN_VARIABLE.encode() + b"="))
    return entry.split(b"=", 1)[1].decode()


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_what_the_driver_started_goes_with_it_and_nothing_else(how: str) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    driver, (watchdog, head, worker, helper, agent) = _start(how)
    token = _token(head)
    started = fate.processes_with(token)
    assert len(started) == 4 and {head, worker, helper} <= set(started)
    assert watchdog not in started  # the watchdog carries no token: it outlives its own killing
    # The tokenless agent is the helper's descendant: one of the cluster all the same.
    assert agent not in started and agent in fate.cluster(token) and watchdog not in fate.cluster(token)
    try:
        if how == "kill":
            # Its helper dies first (a raylet killed before the driver): the agent, an orphan now, is no one's
            # descendant and shows no token; the watchdog recorded it while the driver lived.
            time.sleep(3 * fate.RECORD_S)
            os.kill(helper, signal.SIGKILL)
            assert _wait_gone([helper]) == [] and _alive(agent)
            driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        assert _wait_gone([head, worker, *started, watchdog, agent]) == []
        assert fate.processes_with(token) == []
        assert _alive(bystander.pid)
    finally:
        assert driver.stdout is not None
        driver.stdout.close()
        bystander.kill()
        bystander.wait()
        for pid in [*started, agent]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_only_an_exact_token_matches(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, environ in {"11": b"A=1\0AGL_TRAINER_FATE_TOKEN=abc\0", "12": b"AGL_TRAINER_FATE_TOKEN=abcd\0",
                         "13": b"X=AGL_TRAINER_FATE_TOKEN=abc\0", "self": b""}.items():  # fmt: skip
        (proc / pid).mkdir(parents=True)
        (proc / pid / "environ").write_bytes(environ)
    (proc / "14").mkdir()  # a process that went away (no environ to read)
    assert fate.processes_with("abc", proc) == [11]


def test_a_recorded_process_is_known_by_its_start_time_not_its_pid_alone() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started = int(Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    try:
        assert fate.still_running({sleeper.pid: started}) == {sleeper.pid: started}
        # The same pid with another start time is a reused pid, not the process recorded: never killed for it.
        assert fate.still_running({sleeper.pid: started - 1}) == {}
    finally:
        sleeper.kill()
        sleeper.wait()
    assert fate.still_running({sleeper.pid: started}) == {}


# A driver that exits through the interpreter (as agl-trainer does after ray.shutdown()), one process of its cluster
# still running (a Ray worker on its way out), and one that kill -9 ends in the same state.
LEAVING_DRIVER = """
import os, signal, subprocess, sys
from services.trainer.run.fate import share_fate
watchdog = share_fate()
lingerer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(watchdog.pid, lingerer.pid, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
"""


@pytest.mark.parametrize(("how", "said"), [("exit", []), ("kill", ["the driver is gone; stopped 1 process(es)"])])
def test_what_is_left_is_stopped_and_only_a_dead_drivers_cluster_is_reported(how: str, said: list[str]) -> None:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    driver = subprocess.Popen(
        [sys.executable, "-c", LEAVING_DRIVER, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=repo,
    )
    # Returns once every holder of the driver's pipes is gone (the lingerer and the watchdog inherit them).
    out, err = driver.communicate(timeout=60)
    watchdog, lingerer = (int(p) for p in out.split())
    assert driver.returncode == (3 if how == "exit" else -signal.SIGKILL)
    assert _wait_gone([lingerer, watchdog]) == []
    lines = [line.removeprefix("agl-trainer: ") for line in err.splitlines() if line.startswith("agl-trainer:")]
    assert [line.split(" of its")[0] for line in lines] == said, err


# A driver whose ray.init failed: what that try started (a GCS, a raylet) is killed before the next try, and the
# watchdog, the driver's child too, is spared (its pipe is the driver's fate).
FAILED_START_DRIVER = """
import subprocess, sys, time
from services.trainer.run.fate import kill_failed_start, share_fate
watchdog = share_fate()
gcs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(0.5)
killed = kill_failed_start(watchdog.pid)
gcs.wait(timeout=10)
print(killed, gcs.returncode, watchdog.poll(), flush=True)
"""


def test_a_failed_starts_leftovers_are_killed_and_the_watchdog_spared() -> None:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-c", FAILED_START_DRIVER], capture_output=True, text=True, env=env, cwd=repo, timeout=60
    )
    killed, gcs_code, watchdog_code = done.stdout.split()
    assert (killed, gcs_code, watchdog_code) == ("1", str(-signal.SIGKILL), "None"), done.stdout + done.stderr


# A watcher acts the moment the process it watches dies (as the task runner records a failed run when a worker's
# socket closes): the sweep freezes the whole cluster before killing any of it, so no watcher gets to act.
WATCHER = """
import os, sys
os.read(int(sys.argv[1]), 1)  # EOF: the watched process died
open(sys.argv[2], "w").write("acted")
"""


def test_no_process_of_the_cluster_sees_another_die(tmp_path: Path) -> None:
    token = "test-" + os.urandom(6).hex()
    env = {**os.environ, fate.TOKEN_VARIABLE: token}
    pairs = []
    for index in range(8):
        read_end, write_end = os.pipe()
        watched = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(write_end,), env=env
        )
        acted = tmp_path / f"acted-{index}"
        watcher = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(read_end), str(acted)], pass_fds=(read_end,), env=env
        )
        os.close(read_end)
        os.close(write_end)
        pairs.append((watched, watcher, acted))
    deadline = time.monotonic() + 20
    while len(fate.processes_with(token)) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fate.kill_all(token, quiet_s=0.3) == 16
    for watched, watcher, _ in pairs:
        assert watched.wait(timeout=10) == watcher.wait(timeout=10) == -signal.SIGKILL
    assert [acted.name for _, _, acted in pairs if acted.exists()] == []
