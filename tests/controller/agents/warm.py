"""Agent classes for the warm launcher tests. Each reads what it needs from its environment (env_map)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from tests.controller.agents import tools

# Read at import time, i.e. in the launcher: a warm child sees the launcher's value, a fresh one its own.
EVENT_URL_AT_IMPORT = os.environ.get("AGL_EVENT_URL", "")


def _mark(label: str) -> None:
    """Appends "label attempt-url pid" to the file named by MARKS, so a test can count launches."""
    with open(os.environ["MARKS"], "a") as out:
        out.write(f"{label} {os.environ['AGL_EVENT_URL']} {os.getpid()}\n")


class EnvAgent:
    """Writes what it sees of the environment, waits until its peers did too, then leaves a variable behind."""

    def run(self) -> None:
        folder = Path(os.environ["OUT_DIR"])
        seen = {k: v for k, v in os.environ.items() if k.startswith("AGL_") or k in ("LEAK", "NAME")}
        # Which process this is: a contained agent's pid is its own namespace's, whose id a later one may reuse.
        started = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
        process = f"{os.readlink('/proc/self/ns/pid')} {os.getpid()} {started}"
        (folder / f"{os.environ['NAME']}.json").write_text(json.dumps({"env": seen, "pid": process}))
        deadline = time.monotonic() + 20
        while len(list(folder.glob("*.json"))) < int(os.environ["PEERS"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.environ["LEAK"] = os.environ["NAME"]
        os.environ["AGL_KEY"] = "overwritten-by-the-agent"
        print(f"{os.environ['NAME']} done")


class FamilyAgent:
    """Starts children that ignore SIGTERM (and a grandchild), records their pids, then hangs."""

    def run(self) -> None:
        tools.spawn_family(os.environ["PID_FILE"])


class HangAgent:
    def run(self) -> None:
        _mark("hang")
        print("hanging", flush=True)
        time.sleep(600)


class MarkAgent:
    def run(self) -> None:
        _mark("mark")


class ExitAgent:
    def run(self) -> None:
        print("leaving with os._exit(3)", flush=True)
        os._exit(3)


class SysExitAgent:
    def run(self) -> None:
        sys.exit(5)


class RaiseAgent:
    def run(self) -> None:
        raise ValueError("boom on purpose")


class SegfaultAgent:
    def run(self) -> None:
        print("about to crash", flush=True)
        ctypes.string_at(0)


class ImportEnvAgent:
    """Prints the event URL its module saw at import time next to the one it sees now, and its arguments."""

    def run(self) -> None:
        print(json.dumps({"at_import": EVENT_URL_AT_IMPORT, "now": os.environ["AGL_EVENT_URL"], "argv": sys.argv[1:]}))


class LazyImportAgent:
    """Says whether a small library module it imports lazily was already loaded when it started."""

    def run(self) -> None:
        loaded = "colorsys" in sys.modules
        import colorsys  # noqa: F401

        print(json.dumps({"preloaded": loaded}))


class TlsEnvAgent:
    """Records the CA variables it was started with, then builds the HTTP clients a typical agent builds."""

    def run(self) -> None:
        import httpx

        seen = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        with httpx.Client() as client:  # a TLS context from those variables; must not fail
            seen["verify_mode"] = int(client._transport._pool._ssl_context.verify_mode)
        Path(os.environ["OUT_FILE"]).write_text(json.dumps(seen))
