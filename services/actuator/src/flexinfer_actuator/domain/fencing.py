"""Fencing: the actuator obeys only the current scheduler leader.

Each leader takes an epoch from PostgreSQL when it acquires the leader lock (a sequence: every later leader's is
higher) and puts it on every command (``ScaleCommand.leader_epoch``). The actuator keeps the highest epoch it has
seen. A command with a lower one comes from a deposed leader (still running, cut off from the database, or a
replayed message) and is refused, whatever its generation; a higher one is a new leader's and is obeyed even when
its generations are lower than the deposed leader's (generations are compared only within one epoch).

Pure: the state (the highest epoch, the last applied epoch and generation of each model) is the caller's.
"""

from __future__ import annotations

from enum import StrEnum

from flexinfer_actuator.domain.commands import GenerationVerdict, should_apply
from flexinfer_common.messages import ScaleCommand


class EpochVerdict(StrEnum):
    CURRENT = "current"  # the leader whose commands we follow
    NEW_LEADER = "new-leader"  # higher than any seen: a new leader took over
    DEPOSED = "deposed"  # lower than one seen: refuse


def judge_epoch(epoch: int, highest_seen: int) -> EpochVerdict:
    if epoch > highest_seen:
        return EpochVerdict.NEW_LEADER
    if epoch == highest_seen:
        return EpochVerdict.CURRENT
    return EpochVerdict.DEPOSED


def judge_command(
    command: ScaleCommand, *, highest_epoch: int, last_applied: tuple[int, int] | None
) -> tuple[EpochVerdict, GenerationVerdict | None]:
    """The epoch verdict, and (unless deposed) the generation verdict against ``last_applied`` (the epoch and
    generation of the last command applied for the model, None if none): a later epoch applies whatever the
    generation, the same epoch compares generations, an earlier one is stale."""
    epoch_verdict = judge_epoch(command.leader_epoch, highest_epoch)
    if epoch_verdict is EpochVerdict.DEPOSED:
        return epoch_verdict, None
    if last_applied is None:
        return epoch_verdict, GenerationVerdict.APPLY
    applied_epoch, applied_generation = last_applied
    if command.leader_epoch > applied_epoch:
        return epoch_verdict, GenerationVerdict.APPLY
    if command.leader_epoch < applied_epoch:
        return epoch_verdict, GenerationVerdict.STALE
    return epoch_verdict, should_apply(command, applied_generation)
