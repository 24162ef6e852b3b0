"""One run of a real command-line harness as an AGL rollout, the harness itself unmodified.

The rollout gives the task (AGL_TASK_QUESTION, and AGL_TASK_ANSWER for the check, both from the rollout's input by
its env_map) and AGL's three variables. The harness runs in a workspace of its own with a private HOME (its
settings, sessions and caches go there and are deleted afterwards, so rollouts never see each other's or the user's
state), reaching the model only through the rollout's proxy URL with the rollout's key. When it is done, the check
(check.py) scores its final message and workspace, and the reward is posted to AGL_EVENT_URL.

Guarantee: a reward is posted only when the harness exited 0 and the model answered at least one of its calls (the
harness reports the output tokens it got). A harness that exits non-zero fails the rollout with its own exit status;
one that exits 0 although no model call was answered (a harness may hide an API error behind exit 0) fails it with
exit status 3. Either way the last line of the log says why in one line, and no reward 0 stands for a policy that
never answered (such a rollout has no row to train, so it is in no group's baseline; the trainer counts it).

Only the standard library: the recipe runs with any Python 3.10+.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import check

# Where `make harnesses` installs the pinned CLIs (examples/harnesses/package.json), relative to the checkout.
INSTALLED_BIN = Path(__file__).resolve().parents[2] / ".harnesses" / "node_modules" / ".bin"
# Exit status of a harness that exited 0 although the model answered none of its calls.
NO_ANSWER_EXIT = 3
# Exit status of a rollout that cannot start the harness (a missing variable, no CLI installed).
SETUP_EXIT = 2
# Variables of the caller's environment that would point a harness elsewhere or at the caller's own account and
# settings: left out of the harness's environment, which then gets only the recipe's own.
_FOREIGN_PREFIXES = (
    "ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "QWEN_", "AZURE_OPENAI_", "GEMINI_", "LITELLM_", "XDG_",
)  # fmt: skip


@dataclass(frozen=True)
class Rollout:
    """What the rollout gives the harness: AGL's variables and the task."""

    base_url: str  # AGL_OPENAI_BASE_URL: the rollout's OpenAI-style base URL, ending in /v1
    event_url: str
    key: str
    question: str
    answer: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Rollout:
        missing = [name for name in ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_TASK_QUESTION") if not env.get(name)]
        if missing:
            raise SetupError(
                f"{', '.join(missing)} not set: run it as an AGL rollout whose env_map gives the task "
                "(--env-map AGL_TASK_QUESTION=input.question --env-map AGL_TASK_ANSWER=input.answer)"
            )
        return cls(
            base_url=env["AGL_OPENAI_BASE_URL"].rstrip("/"),
            event_url=env["AGL_EVENT_URL"],
            key=env.get("AGL_KEY", ""),
            question=env["AGL_TASK_QUESTION"],
            answer=env.get("AGL_TASK_ANSWER", ""),
        )


@dataclass(frozen=True)
class Places:
    """The rollout's private folders."""

    home: Path
    workspace: Path


@dataclass(frozen=True)
class Outcome:
    """What the harness reported about its run, read from its machine-readable output."""

    output_tokens: int  # summed over its model calls: 0 means the model answered none of them
    final_text: str  # its last message to the user
    error: str = ""  # its own error line, if it reported one


@dataclass(frozen=True)
class Harness:
    """One CLI: how it is started for a rollout and how its output is read."""

    name: str
    program: str  # the CLI's command name (node_modules/.bin/<program>)
    # Writes the harness's settings under places.home and returns (arguments after the program, its variables).
    prepare: Callable[[Rollout, Places], tuple[list[str], dict[str, str]]]
    # Reads what the harness reported: (stdout, or the text of `report` when set; stderr).
    outcome: Callable[[str, str], Outcome]
    # A file, relative to the private HOME, that the harness writes its machine-readable report to ("": stdout).
    report: str = ""
    # Where `make harnesses` puts its CLI (the npm ones by default).
    installed_bin: Path = INSTALLED_BIN


class SetupError(Exception):
    """The rollout cannot start its harness."""


def find_program(program: str, env: Mapping[str, str], installed_bin: Path = INSTALLED_BIN) -> str:
    """The CLI: HARNESS_BIN when set, else the one `make harnesses` installed, else the one on PATH."""
    chosen = env.get("HARNESS_BIN")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise SetupError(f"HARNESS_BIN={chosen} is not an executable file")
        return chosen
    installed = installed_bin / program
    if os.access(installed, os.X_OK):
        return str(installed)
    found = shutil.which(program, path=env.get("PATH"))
    if found is None:
        raise SetupError(
            f"{program} not found in {installed_bin} nor on PATH: run `make harnesses` (the pinned CLIs) "
            "or set HARNESS_BIN"
        )
    return found


def harness_env(base: Mapping[str, str], places: Places, own: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without anything that names another provider, account or config folder, with the
    private HOME (XDG folders under it) and the harness's own variables."""
    env = {name: value for name, value in base.items() if not name.startswith(_FOREIGN_PREFIXES)}
    env["HOME"] = str(places.home)
    for name, folder in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local")):
        env[name] = str(places.home / folder)
    env.update(own)
    return env


def post_reward(rollout: Rollout, value: float, reason: str, source: str) -> None:
    """The reward event; raises when the proxy does not accept it (the rollout then fails: no silent drop)."""
    body = {"event_type": "reward", "data": {"value": value, "reason": reason, "source": source}}
    request = urllib.request.Request(rollout.event_url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if rollout.key:
        request.add_header("Authorization", f"Bearer {rollout.key}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def _report(harness: Harness, places: Places, stdout: str) -> str:
    if not harness.report:
        return stdout
    path = places.home / harness.report
    return path.read_text(errors="replace") if path.is_file() else ""


def run(harness: Harness, env: Mapping[str, str] | None = None) -> int:
    """Runs the harness once for the rollout in env (os.environ); returns the exit status for the rollout."""
    env = os.environ if env is None else env
    try:
        rollout = Rollout.from_env(env)
        program = find_program(harness.program, env, harness.installed_bin)
    except SetupError as err:
        print(f"{harness.name}: {err}", flush=True)
        return SETUP_EXIT
    with tempfile.TemporaryDirectory(prefix=f"agl-{harness.program}-") as root:
        places = Places(home=Path(root) / "home", workspace=Path(root) / "workspace")
        places.home.mkdir()
        places.workspace.mkdir()
        arguments, own = harness.prepare(rollout, places)
        print(f"{harness.name}: {program} in {places.workspace}", flush=True)
        finished = subprocess.run(
            [program, *arguments],
            cwd=places.workspace,
            env=harness_env(env, places, own),
            stdin=subprocess.DEVNULL,  # headless: a harness that waits for more input gets none
            capture_output=True,
            text=True,
            check=False,
        )
        # The harness's own record of its run, kept in the agent's log.
        print(finished.stderr, file=sys.stderr, flush=True)
        print(finished.stdout, flush=True)
        outcome = harness.outcome(_report(harness, places, finished.stdout), finished.stderr)
        if finished.returncode != 0:
            print(f"{harness.name}: exited {finished.returncode}: {outcome.error or 'no error reported'}", flush=True)
            return finished.returncode
        if outcome.output_tokens <= 0:
            why = outcome.error or "no output token reported"
            print(f"{harness.name}: exited 0 but the model answered none of its calls ({why}); no reward", flush=True)
            return NO_ANSWER_EXIT
        value, reason = check.score(places.workspace, outcome.final_text, rollout.answer)
    post_reward(rollout, value, reason, source=harness.program)
    print(f"{harness.name}: reward {value:g} ({reason})", flush=True)
    return 0


def main(harness: Harness) -> None:
    sys.exit(run(harness))
