"""What tests measure reaches the end of the run's summary once each, whether the suite runs in one process or on
pytest-xdist's workers (`make test`), whose own output is not shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MEASURING = """
import pytest

from tests.support.figures import figures


@pytest.fixture(scope="module")
def measured(request):
    shown = figures(request.config, "install")
    shown.append("installed in 1.5 s")
    yield shown
    shown.append("stopped in 0.2 s")


def test_one(measured):
    measured.append("swap took 3.0 s")


def test_two(request):
    figures(request.config, "fuzz").append("proxy 120 requests")


def test_three_fails(request):
    figures(request.config, "fuzz").append("scheduler 80 requests")
    assert False
"""


@pytest.mark.parametrize("workers", ["0", "2"], ids=["one-process", "xdist-workers"])
def test_figures_are_shown_once_at_the_end_even_on_xdist_workers(tmp_path: Path, workers: str) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.figures"]\n')
    (tmp_path / "test_measuring.py").write_text(MEASURING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", workers, "--dist", "loadfile", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr  # the failing test fails the run; its figure is still shown
    assert "= install =" in out and "= fuzz =" in out, out
    summary = out[min(out.index("= install ="), out.index("= fuzz =")) :]  # not the failure's source lines
    for line in (
        "installed in 1.5 s",
        "swap took 3.0 s",
        "stopped in 0.2 s",
        "proxy 120 requests",
        "scheduler 80 requests",
    ):
        assert summary.count(line) == 1, out
    assert summary.index("installed in 1.5 s") < summary.index("swap took 3.0 s") < summary.index("stopped in 0.2 s")
