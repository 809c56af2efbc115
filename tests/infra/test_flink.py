"""Flink is real: PyFlink's runtime with the pinned Kafka SQL connector reads what Loopline produced."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

from pyflink.table import EnvironmentSettings, TableEnvironment

from infra.stack import LocalStack
from schemas.topics import DAY_MS, TopicSpec
from streams.producer import EventProducer
from streams.topics import apply_topics
from tests.support.templates import TransactionEvent, fraud_world

PROBE = TopicSpec("test.flink", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)


def test_flink_sql_job_reads_the_topic_through_the_connector(stack: LocalStack, bootstrap: str) -> None:
    apply_topics(bootstrap, [PROBE])
    stream = fraud_world(4, 1_760_000_000_000, users=50, late_rate=0.0)
    events = [e for e in itertools.islice(stream, 3_000) if e.topic == "events.transactions"]
    EventProducer(bootstrap).publish(dataclasses.replace(e, topic=PROBE.name) for e in events)
    expected: dict[str, float] = defaultdict(float)
    for e in events:
        expected[e.record.user_id] += e.record.amount

    env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    env.get_config().set("pipeline.jars", stack.flink.connector_jar.as_uri())
    env.get_config().set("parallelism.default", "1")
    env.execute_sql(
        f"""
        CREATE TABLE tx (user_id STRING, amount DOUBLE) WITH (
          'connector' = 'kafka',
          'topic' = '{PROBE.name}',
          'properties.bootstrap.servers' = '{bootstrap}',
          'properties.group.id' = 'test-flink',
          'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset',
          'format' = 'json'
        )"""
    )
    with env.execute_sql("SELECT user_id, SUM(amount), COUNT(*) FROM tx GROUP BY user_id").collect() as rows:
        got = {row[0]: (row[1], row[2]) for row in rows}
    assert sum(count for _, count in got.values()) == len(events)
    assert got.keys() == expected.keys()
    for user, total in expected.items():
        assert abs(got[user][0] - total) <= 1e-6 * max(1.0, abs(total))
