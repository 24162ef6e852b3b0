"""A finished run's ledger, served again on demand: `agl runs --from DIR`, `agl run ID --from DIR`, `agl open DIR`.

`agl train` and `make demo` keep their ledger's SQLite file and master key in the run folder (stack/ledger-data/,
key), and stop every service when they end. Their runs are read afterwards by starting a ledger on that file (and
the console, for `agl open`) on free loopback ports, and stopping it again. The file is the ledger's own store:
nothing is copied, and what the console or agl changes (a label, a deletion) is kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import USAGE, CliError

STORE = Path("stack") / "ledger-data" / "ledger.db"
KEY_FILE = "key"
RUNS_DIR = Path("agl-runs")


@dataclass(frozen=True)
class Served:
    folder: Path
    ledger: str
    key: str
    console_url: str  # "" without the console


def run_folder(given: str | Path) -> Path:
    """The folder holding a stored ledger: DIR itself, or agl-runs/DIR (a run id); one line when neither has one."""
    for folder in (Path(given), RUNS_DIR / str(given)):
        if (folder / STORE).is_file() and (folder / KEY_FILE).is_file():
            return folder.resolve()
    raise CliError(
        f"--from {given}: no stored ledger there ({Path(given) / STORE} and its {KEY_FILE} file, as agl train and "
        "make demo leave in their run folder)",
        USAGE,
    )


@contextlib.contextmanager
def serving(given: str | Path, *, console: bool) -> Iterator[Served]:
    """The ledger (and the console) on the folder's stored ledger, until the block ends."""
    from services.stack import local_stack as stack_module

    folder = run_folder(given)
    key = (folder / KEY_FILE).read_text().strip()
    wanted = ["ledger", *(["console"] if console else [])]
    specs = stack_module.load_compose({**os.environ, "AGL_KEY": key}, ["console"])
    specs = {name: specs[name] for name in wanted}
    # Logs of their own: the run's logs/ledger.log stays what the run itself logged.
    plans = stack_module.localize(specs, folder / "stack")
    try:
        with stack_module.run_stack(plans, stack_module.start_order(specs), folder / "logs" / "reopened") as running:
            ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
            console_url = ""
            if console:
                console_url = f"http://{running['console'].address(int(specs['console'].env['AGL_CONSOLE_PORT']))}/"
            yield Served(folder, ledger, key, console_url)
    except stack_module.StackError as err:
        raise CliError(f"the stored ledger of {folder} did not start: {err}") from None
