"""Fencing (domain/fencing.py): the actuator obeys only the current scheduler leader, judged by the leader epoch
on each command before its generation."""

from __future__ import annotations

import pytest

from flexinfer_actuator.domain.commands import GenerationVerdict
from flexinfer_actuator.domain.fencing import EpochVerdict, judge_command
from tests.support.actuator import scale_command


@pytest.mark.parametrize(
    ("epoch", "generation", "highest", "last_applied", "expected"),
    [
        pytest.param(1, 0, 0, None, (EpochVerdict.NEW_LEADER, GenerationVerdict.APPLY), id="first-leader-seen"),
        pytest.param(3, 5, 3, (3, 4), (EpochVerdict.CURRENT, GenerationVerdict.APPLY), id="current-leader-newer"),
        pytest.param(3, 4, 3, (3, 4), (EpochVerdict.CURRENT, GenerationVerdict.REREPORT), id="current-leader-repeat"),
        pytest.param(3, 2, 3, (3, 4), (EpochVerdict.CURRENT, GenerationVerdict.STALE), id="current-leader-stale"),
        pytest.param(2, 1_000_000, 3, (3, 4), (EpochVerdict.DEPOSED, None), id="deposed-leader-refused-any-generation"),
        pytest.param(0, 1_000_000, 3, None, (EpochVerdict.DEPOSED, None), id="unfenced-command-refused-once-fenced"),
        pytest.param(
            4, 1, 3, (3, 15), (EpochVerdict.NEW_LEADER, GenerationVerdict.APPLY), id="new-leader-lower-generation"
        ),
        pytest.param(
            3, 1, 3, (2, 15), (EpochVerdict.CURRENT, GenerationVerdict.APPLY), id="model-last-applied-under-old-leader"
        ),
        pytest.param(
            0, 2, 0, (0, 1), (EpochVerdict.CURRENT, GenerationVerdict.APPLY), id="unfenced-scheduler-as-before"
        ),
    ],
)
def test_judge_command(
    epoch: int,
    generation: int,
    highest: int,
    last_applied: tuple[int, int] | None,
    expected: tuple[EpochVerdict, GenerationVerdict | None],
) -> None:
    command = scale_command(generation=generation, epoch=epoch)
    assert judge_command(command, highest_epoch=highest, last_applied=last_applied) == expected
