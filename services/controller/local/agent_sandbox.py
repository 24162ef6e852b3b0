"""The controller's side of agent containment: which policy local agents get, and whether this host can apply it.

`--agent-sandbox auto` (the default) contains every local agent when the host allows it (Linux, and root or
unprivileged user namespaces) and otherwise says once, as a warning, why agents run uncontained; `on` makes that
a start error (exit 2); `off` never contains them. The check is the real thing: sandbox.py run once with the
policy, `--check`, before the controller serves.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .sandbox import Policy

AUTO, ON, OFF = "auto", "on", "off"
MODES = (AUTO, ON, OFF)
SANDBOX_FILE = str(Path(__file__).with_name("sandbox.py"))
_CHECK_TIMEOUT_S = 30.0


class SandboxUnavailable(Exception):
    """The sandbox was asked for (or an agent user named) and this host cannot apply it; the message says why."""


def parse_agent_user(text: str) -> tuple[int, int] | None:
    """ "" -> None; "nobody" -> its uid and primary gid; "1234" -> (1234, 1234); "1234:5678" -> (1234, 5678)."""
    text = text.strip()
    if not text:
        return None
    user, _, group = text.partition(":")
    if user.isdigit():
        uid = int(user)
    else:
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            raise ValueError(f"--agent-user: no user named {user!r}") from None
    if group:
        if not group.isdigit():
            raise ValueError(f"--agent-user: the group of {text!r} must be a number (uid:gid)")
        return uid, int(group)
    if user.isdigit():
        return uid, uid
    return uid, pwd.getpwnam(user).pw_gid


def build_policy(hide: Sequence[str], user: tuple[int, int] | None) -> Policy:
    """The paths hidden from agents (made absolute, duplicates dropped, in order) and the identity they run as."""
    paths: list[str] = []
    for path in hide:
        absolute = os.path.abspath(path)
        if path and absolute not in paths:
            paths.append(absolute)
    uid, gid = user if user is not None else (None, None)
    return Policy(tuple(paths), uid, gid)


def check(policy: Policy, python: str = sys.executable) -> str | None:
    """None when agents can be contained under policy on this host, else the reason (one line)."""
    if not sys.platform.startswith("linux"):
        return f"agent containment needs Linux namespaces (this is {sys.platform})"
    argv = [python, "-I", "-S", SANDBOX_FILE, *policy.args(), "--check"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the sandbox check could not run: {err}"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"the sandbox check exited with {done.returncode}"


def resolve(mode: str, policy: Policy, python: str = sys.executable) -> tuple[Policy | None, str]:
    """The policy local agents run under (None: uncontained) and, when auto fell back, the reason to warn with.

    Raises SandboxUnavailable when mode is on, or an agent user is named, and the host cannot contain agents."""
    if mode == OFF:
        return None, ""
    reason = check(policy, python)
    if reason is None:
        return policy, ""
    if mode == ON or policy.uid is not None:
        asked = "--agent-sandbox on" if mode == ON else "--agent-user"
        raise SandboxUnavailable(f"{asked}: local agents cannot be contained on this host: {reason}")
    return None, reason
