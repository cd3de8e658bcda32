"""What a test measured, shown at the end of the run even when every test passes (the chaos run's faults, the fuzz
totals, the real servers' install time and swap waits).

A test or fixture appends lines to ``figures(config, title)``. Each test report carries the lines added since the
report before (as a user property), and the summary prints them from the reports: so the figures reach it whether
the suite runs in one process or on pytest-xdist's workers, whose own output `make test` does not show. A plugin:
the root conftest loads it (``pytest_plugins``).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

PROPERTY = "flexinfer-figures"
_PENDING = pytest.StashKey[dict[str, list[str]]]()
_shown: dict[str, list[str]] = {}  # what the reports carried, by title (the process that writes the summary)


def figures(config: pytest.Config, title: str) -> list[str]:
    """The list to append this run's lines under ``title`` to (the same list for the whole run)."""
    return config.stash.setdefault(_PENDING, {}).setdefault(title, [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Move the lines added since the last report onto this one (a new list: the item's own stays as it was)."""
    report = yield
    pending = item.config.stash.get(_PENDING, {})
    new = [(PROPERTY, (title, list(lines))) for title, lines in pending.items() if lines]
    if new:
        report.user_properties = [*report.user_properties, *new]
        for lines in pending.values():
            lines.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the figures in the order the reports arrive (on xdist, each worker's in its own order)."""
    for name, value in report.user_properties:
        if name == PROPERTY:
            title, lines = value
            _shown.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, lines in _shown.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
