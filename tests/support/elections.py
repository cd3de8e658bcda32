"""Election tables: one row per rule, keyed by the rule's id (the test id), and what a row compares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from flexinfer_scheduler.domain.election import Election, ElectionReason
from flexinfer_scheduler.domain.model import GroupSnapshot

#: what an election should come to: the leader's name (None: no leader) and the reason
Outcome = tuple[str | None, ElectionReason]


def rules(*tables: Mapping[str, tuple[Outcome, GroupSnapshot]]) -> list[Any]:
    """Tables ``{rule id: ((leader, reason), snapshot)}`` as parameters ``(snapshot, leader, reason)``, each with its
    rule id as the test id (a rule id in two tables is an error, not a row lost)."""
    ids = [rule for table in tables for rule in table]
    repeated = sorted({rule for rule in ids if ids.count(rule) > 1})
    if repeated:
        raise ValueError(f"rule ids in more than one table: {repeated}")
    return [pytest.param(snapshot, *result, id=rule) for table in tables for rule, (result, snapshot) in table.items()]


def outcome(election: Election) -> Outcome:
    return (election.leader.name if election.leader else None, election.reason)
