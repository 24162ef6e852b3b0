"""A pytest plugin (registered in tests/conftest.py) that appends each test phase's duration to the file named by
AGL_TEST_TIMES, one line per phase as it ends: `seconds<TAB>phase<TAB>node id`.

Why not --junitxml or --durations: both are written when the session ends, and a CI run stopped at its time
limit ends without them. A line flushed per phase survives any stop, so `tools/test_times.py` can always say
where the time went.
"""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("AGL_TEST_TIMES")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{report.duration:.2f}\t{report.when}\t{report.nodeid}\n")
