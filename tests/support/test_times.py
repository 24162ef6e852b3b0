"""A pytest plugin (registered in tests/conftest.py) that appends each test phase's duration to the file named by
AGL_TEST_TIMES, one line per phase as it ends: `seconds<TAB>phase<TAB>node id`.

Why not --junitxml or --durations: both are written when the session ends, and a CI run stopped at its time
limit ends without them. A line flushed per phase survives any stop, so `tools/test_times.py` can always say
where the time went.
"""

from __future__ import annotations

import os

import pytest

_recording = True


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist the controller is handed every worker's reports again: only the process that ran the
    # test writes its line (a worker, or the one process of a run without workers).
    global _recording
    _recording = hasattr(config, "workerinput") or getattr(config.option, "dist", "no") == "no"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("AGL_TEST_TIMES")
    if not path or not _recording:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{report.duration:.2f}\t{report.when}\t{report.nodeid}\n")
