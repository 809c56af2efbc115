"""schemas/topics.py's replication_for: the replication a cluster's shape gives Loopline's topics. No stack."""

from __future__ import annotations

import pytest

from schemas.topics import Replication, replication_for


@pytest.mark.parametrize(
    ("brokers", "expected"),
    [(1, Replication(1, 1)), (2, Replication(2, 1)), (3, Replication(3, 2)), (5, Replication(3, 2)), (9, Replication(3, 2))],
)
def test_up_to_three_replicas_and_one_fewer_in_sync(brokers: int, expected: Replication) -> None:
    assert replication_for(brokers) == expected
