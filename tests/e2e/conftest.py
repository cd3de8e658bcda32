"""The end-to-end suite's figures (the real servers' install time, swap waits, ...) at the end of the run, where
`make test` and CI show them even when every test passes."""

from __future__ import annotations

import pytest

from flexinfer_testbed.real_servers import FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = terminalreporter.config.stash.get(FIGURES, [])
    if figures:
        terminalreporter.section("real inference servers")
        for line in figures:
            terminalreporter.write_line(line)
