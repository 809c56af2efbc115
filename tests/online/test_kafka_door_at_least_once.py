"""The at-least-once Kafka door commits a partition only past requests whose records the broker acknowledged."""

from __future__ import annotations

from online.kafka_door_at_least_once import Acknowledgements


def _offsets(acks: Acknowledgements, partitions=None) -> dict:
    return {(tp.topic, tp.partition): tp.offset for tp in acks.committable(partitions)}


def test_commits_stop_at_the_oldest_unacknowledged_record() -> None:
    acks, p0, p1 = Acknowledgements(), ("requests", 0), ("requests", 1)
    for offset in (10, 11, 12):
        acks.taken(p0, offset)
    acks.taken(p1, 5)
    assert _offsets(acks) == {p0: 10, p1: 5} and acks.waiting == 4
    acks.acknowledged(p0, 11)  # out of order: 10 is still owed, so nothing past it is safe
    assert _offsets(acks)[p0] == 10
    acks.acknowledged(p0, 10)
    assert _offsets(acks)[p0] == 12
    acks.acknowledged(p0, 12)
    acks.acknowledged(p1, 5)
    assert _offsets(acks) == {p0: 13, p1: 6} and acks.waiting == 0
    assert _offsets(acks, [p1]) == {p1: 6}
    acks.forget([p0])
    assert _offsets(acks) == {p1: 6}
