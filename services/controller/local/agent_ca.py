"""Which CA certificates local agents are told to trust, chosen so that a TLS context costs them nothing.

Every HTTP client an agent builds (the OpenAI SDK's, each `httpx.post`) makes a TLS context even for plain
`http://` URLs, and making one from a CA *bundle* file parses every certificate in it: ~30 ms of CPU per
context with OpenSSL 3, two or more per agent process, more than the rest of a short agent's work. A
hashed CA *directory* (`SSL_CERT_DIR`, what `c_rehash` / Debian's `update-ca-certificates` write) is read
lazily, one certificate file at verification time, so the same context costs ~1 ms.

Modes (the controller's `--agent-ca`):
- `system-dir` (default): when the agents' environment names a bundle that is the operating system's own
  (`ca-certificates.crt` inside a hashed directory: the same certificates, concatenated), the directory
  replaces it. When it names none (httpx and requests then read certifi's bundle), the system's hashed
  directory is named, so agents trust the operating system's store, as curl and OpenSSL do. A bundle of
  the user's own (any other file) is left alone.
- `inherit`: the environment is passed on untouched.

A rollout's env_map may still set `SSL_CERT_FILE`; it is applied after this and wins (clients read the
file before the directory).

What it earns, measured on an agent that does a whole rollout (`bench/controller_bench.py --agent calc`: the
unmodified calc agent, a tool call and an answer through the proxy, a reward posted, bursts of 200 at concurrency
32 on two cores, three rounds alternated with `--agent-ca inherit`): 32.7 rollouts/s with `system-dir`, 17.8
with `inherit` (+84%); the agent process's CPU 46.6 ms a rollout against 93.9 ms.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

SYSTEM_DIR = "system-dir"
INHERIT = "inherit"
MODES = (SYSTEM_DIR, INHERIT)

CERT_FILE_VAR = "SSL_CERT_FILE"
CERT_DIR_VAR = "SSL_CERT_DIR"
# Debian/Ubuntu (ca-certificates), Alpine; the bundle each writes inside the directory it names.
SYSTEM_CA_DIRS = ("/etc/ssl/certs",)
SYSTEM_BUNDLE_NAME = "ca-certificates.crt"


def is_hashed_dir(path: Path) -> bool:
    """Whether path holds OpenSSL subject-hash links (`1a2b3c4d.0`), which lazy lookup needs."""
    try:
        with os.scandir(path) as entries:
            return any(len(e.name) == 10 and e.name[8:] == ".0" for e in entries)
    except OSError:
        return False


def agent_ca_env(
    env: Mapping[str, str], mode: str = SYSTEM_DIR, system_dirs: Iterable[str] = SYSTEM_CA_DIRS
) -> dict[str, str]:
    """The agents' base environment with the CA variables chosen as the module docstring says."""
    if mode not in MODES:
        raise ValueError(f"agent CA mode must be one of {', '.join(MODES)}, not {mode!r}")
    out = dict(env)
    if mode == INHERIT:
        return out
    bundle = out.get(CERT_FILE_VAR, "")
    directory = out.get(CERT_DIR_VAR, "")
    if bundle:
        bundle_path = Path(bundle)
        same_dir = bundle_path.name == SYSTEM_BUNDLE_NAME and is_hashed_dir(bundle_path.parent)
        if same_dir and (not directory or Path(directory) == bundle_path.parent):
            del out[CERT_FILE_VAR]
            out[CERT_DIR_VAR] = str(bundle_path.parent)
        return out
    if directory:
        return out
    for candidate in system_dirs:
        if is_hashed_dir(Path(candidate)):
            out[CERT_DIR_VAR] = candidate
            break
    return out
