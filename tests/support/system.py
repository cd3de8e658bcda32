"""The whole system for a test (``flexinfer_testbed.system.running_system``), on the test's own database, its NATS
(cleaned) and its state folder: in local mode, or in Kubernetes mode given a cluster's ``kubeconfig``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexinfer_testbed.system import System, running_system

#: ``async with start_system(**options) as system``: the whole system (``running_system``'s options) on this
#: test's database and NATS, its state in the test's ``tmp_path``.
SystemStarter = Callable[..., contextlib.AbstractAsyncContextManager[System]]


@pytest.fixture
def start_system(database_url: str, clean_nats: str, tmp_path: Path) -> SystemStarter:
    """Starts the whole system on this test's database and NATS, its state in ``tmp_path``."""

    def start(**options: Any) -> contextlib.AbstractAsyncContextManager[System]:
        return running_system(database_url=database_url, nats_url=clean_nats, state_dir=tmp_path, **options)

    return start
