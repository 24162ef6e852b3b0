"""How `make test` shares the tests between its pytest-xdist workers (`-n 2 --dist loadscope`), a pytest plugin
registered in tests/conftest.py.

- One test file is one unit of work: its module-scoped fixtures (a stack, a stand-in engine) start once, on the
  worker that runs the file.
- Files that share something costly across files go to one worker together: the podman files share the images
  they build and podman's storage; the calc engine (a second real CPU engine, ~3 GB) starts once for both files
  that use it. Every worker starts its own `cpu_engine` (~45 s, ~3 GB).
- The heaviest folders are handed out first, so the two workers end together rather than one waiting on the last
  long file (the order inside a file is kept).

Why parallel at all: a test here mostly waits on one process at a time (a service starting, an agent, a training
step), so a serial run kept the machine's two cores ~55% busy (CI on 2 cores ran 1,565 tests in 5,356 s, over
its limit).
"""

from __future__ import annotations

from typing import Any

import pytest

SHARED_GROUPS = {
    "tests/deploy/test_containers.py": "podman",
    "tests/deploy/test_compose_cpu_training.py": "podman",
    "tests/deploy/test_trainer_image.py": "podman",
    "tests/trainer/test_multiturn_training.py": "calc-engine",
    "tests/engine/test_tool_calls.py": "calc-engine",
}

# Folders by the time their tests take (CI's per-folder figures), the slowest first; any other folder after them.
HEAVIEST_FIRST = ["trainer", "cli", "e2e", "deploy", "engine", "compat", "faults", "controller", "proxy", "ledger"]


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _folder_rank(item: pytest.Item) -> int:
    parts = _file(item).split("/")
    folder = parts[1] if len(parts) > 2 else ""
    return HEAVIEST_FIRST.index(folder) if folder in HEAVIEST_FIRST else len(HEAVIEST_FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with a work unit per file, or per shared group (SHARED_GROUPS). Not the
    xdist_group marker: under pytest 9, xdist 3.8's renaming of a marked test's node id does not reach the
    scheduler, and every test became a unit of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return SHARED_GROUPS.get(file, file)

    return FileGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable: the files of a folder, and the tests of a file, keep their order.
    items.sort(key=_folder_rank)
