"""The launcher's warm-up of the agent's HTTP client libraries (services/controller/local/client_warmup.py).

Each case runs in a fresh interpreter: what is warmed depends on what that process imported."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.procs import REPO_ROOT

PROBE = """
import json, os, sys, threading
for name in sys.argv[1].split(","):
    if name:
        __import__(name)
from services.controller.local.client_warmup import warm_http_clients
warmed = warm_http_clients(timeout_s=3.0)
try:
    leftover = os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    leftover = None
print(json.dumps({"warmed": warmed, "threads": threading.active_count(), "leftover_child": leftover}))
"""


def probe(imports: str, env: dict[str, str] | None = None) -> dict:
    import os

    child_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    child_env.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", PROBE, imports],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env=child_env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_imported_libraries_are_warmed_with_one_call_each_and_nothing_is_left_behind() -> None:
    assert probe("openai,httpx") == {"warmed": ["openai", "httpx"], "threads": 1, "leftover_child": None}
    assert probe("httpx") == {"warmed": ["httpx"], "threads": 1, "leftover_child": None}


def test_a_module_without_those_libraries_gets_no_warm_up() -> None:
    assert probe("json") == {"warmed": [], "threads": 1, "leftover_child": None}


def test_a_call_that_cannot_reach_the_stand_in_is_ignored() -> None:
    # A proxy that does not exist, and loopback not exempted: both calls fail; the launcher carries on.
    dead = {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    assert probe("openai,httpx", dead) == {"warmed": [], "threads": 1, "leftover_child": None}
