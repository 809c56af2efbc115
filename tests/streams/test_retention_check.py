"""A rebuild is refused where a topic no longer retains a view's longest window (``streams/retention_check.py``):
real Kafka, records deleted from the log's start as retention deletes them (``delete_records``)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from feature_store.window_tiles import AggregationSpec
from schemas.topics import DAY_MS, TopicSpec
from streams.retention_check import RetentionError, check_retention, deleted_until_ms
from streams.topics import apply_topics
from tests.support.templates import TransactionEvent, fraud_plan, view_plan

HOUR_MS, MINUTE_MS = 3_600_000, 60_000


def _plan(topic: str, window_ms: int, slide_ms: int):
    view = view_plan("user_stats", [AggregationSpec("txn_count", "count", "amount", window_ms, slide_ms)], topic=topic)
    return fraud_plan(view, topic=topic)


def test_a_rebuild_is_refused_where_the_topic_lost_a_windows_worth(bootstrap: str) -> None:
    topic = TopicSpec(
        f"test.retention.{uuid.uuid4().hex[:8]}", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS
    )
    apply_topics(bootstrap, [topic])
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):  # partition 0: one every 10 minutes from 3 hours ago; partition 1: two records, both deleted
        producer.produce(topic.name, b"{}", partition=0, timestamp=now - 3 * HOUR_MS + i * 10 * MINUTE_MS)
    for _ in range(2):
        producer.produce(topic.name, b"{}", partition=1, timestamp=now - 2 * DAY_MS)
    assert producer.flush(30) == 0
    assert deleted_until_ms(bootstrap, {}, topic.name) is None, "nothing deleted yet"
    check_retention(_plan(topic.name, DAY_MS, 15 * MINUTE_MS), bootstrap, {}, now)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic.name, 0, 5)]).values():
        future.result(30)
    # Partition 0 now starts at the record of 2 h 10 min ago; a window of an hour (and its slide) is still all there.
    assert deleted_until_ms(bootstrap, {}, topic.name) == now - 3 * HOUR_MS + 50 * MINUTE_MS
    check_retention(_plan(topic.name, HOUR_MS, MINUTE_MS), bootstrap, {}, now)
    with pytest.raises(RetentionError) as refused:
        check_retention(_plan(topic.name, 3 * HOUR_MS, MINUTE_MS), bootstrap, {}, now)
    line = str(refused.value)
    assert (
        "\n" not in line and topic.name in line and "user_stats" in line and "LOOPLINE_STREAM__ALLOW_PARTIAL_REBUILD" in line
    ), line

    for future in admin.delete_records([TopicPartition(topic.name, 1, 2)]).values():
        future.result(30)
    assert deleted_until_ms(bootstrap, {}, topic.name) == now - 3 * HOUR_MS + 50 * MINUTE_MS, "the newest deletion bounds"


def test_an_emptied_partition_may_have_lost_records_up_to_retention_ago(bootstrap: str) -> None:
    topic = TopicSpec(
        f"test.retention.{uuid.uuid4().hex[:8]}", TransactionEvent, key="user_id", partitions=1, retention_ms=DAY_MS
    )
    apply_topics(bootstrap, [topic])
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(2):
        producer.produce(topic.name, b"{}", partition=0, timestamp=int(time.time() * 1000) - 2 * DAY_MS)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures complete only while it lives
    for future in admin.delete_records([TopicPartition(topic.name, 0, 2)]).values():
        future.result(30)
    assert deleted_until_ms(bootstrap, {}, topic.name) == pytest.approx(time.time() * 1000 - DAY_MS, abs=60_000)
    with pytest.raises(RetentionError):
        check_retention(_plan(topic.name, DAY_MS, 15 * MINUTE_MS), bootstrap, {})
    check_retention(_plan(topic.name, HOUR_MS, MINUTE_MS), bootstrap, {})
