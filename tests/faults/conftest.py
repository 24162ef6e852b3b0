"""Fault injection on real processes (kill -9, SIGSTOP, a full disk); figures printed at the end of the run."""

from __future__ import annotations

from .figures import FIGURES


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if FIGURES:
        terminalreporter.section("fault-injection figures")
        for case, figure in FIGURES:
            terminalreporter.write_line(f"{case}: {figure}")
