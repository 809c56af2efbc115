"""Streaming features: the Flink job compiled from the Feast definitions agrees with the offline recompute.

Real Kafka, Redis, Flink (PyFlink's mini-cluster, in a `loopline stream submit` subprocess) and Feast.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
import uuid
from dataclasses import replace

import pandas as pd
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from loopline.feature_job_process import start_feature_job, stop_feature_job
from feature_store.config import apply_definitions, feature_store
from infra.service import wait_until
from loopline.settings import Settings
from schemas import DeadLetterRecord, TransactionEvent, decode
from schemas.topics import DAY_MS, TopicSpec
from streams.feature_plan import FeaturePlan, compile_plan
from streams.producer import EventProducer
from streams.recompute import recompute, split_late
from streams.synthetic import Emitted, SyntheticConfig, SyntheticStream

SOURCE = TopicSpec("test.features", TransactionEvent, key="user_id", partitions=3, retention_ms=DAY_MS)
DEAD = TopicSpec("test.features.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
START_MS = int(time.time() * 1000) - 600_000
STREAM = SyntheticConfig(users=300, merchants=40, rate_per_s=200, out_of_order_rate=0.1, late_rate=0.02,
                         malformed_rate=0.01)  # fmt: skip
BATCH = 1_500


def _bad_records() -> list[Emitted]:
    good = json.loads(next(e for e in SyntheticStream(STREAM, 99, START_MS) if e.record).value)
    cases = {
        "not json": b"{this is not json",
        "wrong type": json.dumps({**good, "amount": "twelve"}).encode(),
        "unknown version": json.dumps({**good, "schema_version": 7}).encode(),
    }
    return [Emitted(SOURCE.name, f"bad-{name}", value, START_MS, None) for name, value in cases.items()]


def _read(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}"})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
    consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
    wanted, messages = sum(high - low for low, high in ends.values()), []
    deadline = time.monotonic() + 30
    while len(messages) < wanted and time.monotonic() < deadline:
        messages += [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    consumer.close()
    return messages


def _start_job(settings: Settings, group: str):
    return start_feature_job(
        settings,
        settings.home / f"job-{group}.log",
        LOOPLINE_STREAM__SOURCE_TOPIC=SOURCE.name,
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=DEAD.name,
        LOOPLINE_STREAM__GROUP_ID=group,
        LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS="1000",
        LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline"),
    )


def _committed(bootstrap: str, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    partitions = [TopicPartition(SOURCE.name, p) for p in range(SOURCE.partitions)]
    offsets = consumer.committed(partitions, timeout=10)
    consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def _wait(condition, timeout_s: float, what: str) -> None:
    assert wait_until(condition, timeout_s, interval_s=0.5), f"timed out after {timeout_s:.0f} s waiting for {what}"


def _differences(plan: FeaturePlan, store, expected: dict[str, pd.DataFrame]) -> list[str]:
    problems = []
    for view in plan.views:
        offline = expected[view.name]
        rows = [{view.entity_key: k} for k in offline[view.entity_key]]
        online = store.get_online_features(
            features=[f"{view.name}:{f}" for f in view.feature_names], entity_rows=rows
        ).to_df()
        merged = offline.merge(online, on=view.entity_key, suffixes=("_offline", "_online"))
        for feature in view.feature_names:
            for entity, want, got in zip(merged[view.entity_key], merged[f"{feature}_offline"], merged[f"{feature}_online"]):
                same = (pd.isna(want) and pd.isna(got)) or (
                    not pd.isna(got) and abs(want - got) <= (1e-9 * abs(want) if "mean" in feature else 0)
                )
                if not same:
                    problems.append(f"{view.name}[{entity}].{feature}: online {got}, offline {want}")
    return problems


@pytest.fixture(scope="module")
def plan(settings: Settings, bootstrap: str) -> FeaturePlan:
    from streams.topics import apply_topics

    apply_definitions(settings.registry_path, settings.redis_address)
    apply_topics(bootstrap, [SOURCE, DEAD])
    # Other tests write rows for the same synthetic entities with newer event times; this test
    # compares the whole online store with its own recompute, so it starts from an empty one.
    redis.Redis(port=settings.redis.port).flushdb()
    store = feature_store(settings.registry_path, settings.redis_address)
    return compile_plan(store.list_stream_feature_views()).reading(SOURCE.name)


def test_stream_equals_recompute_through_a_crash(settings: Settings, bootstrap: str, plan: FeaturePlan) -> None:
    job_group = f"test-features-{uuid.uuid4()}"
    stream = iter(SyntheticStream(STREAM, seed=5, start_ms=START_MS))
    first = [e for e in itertools.islice(stream, BATCH) if e.topic == "events.transactions"]
    producer = EventProducer(bootstrap)
    producer.publish([replace(e, topic=SOURCE.name) for e in first] + _bad_records())

    job = _start_job(settings, job_group)
    try:
        _wait(lambda: _committed(bootstrap, job_group) >= len(first) // 2, 180, "a checkpoint covering part of the first batch")
    finally:
        stop_feature_job(job, signal.SIGKILL)  # mid-stream, without warning

    second = [e for e in itertools.islice(stream, BATCH) if e.topic == "events.transactions"]
    producer.publish(replace(e, topic=SOURCE.name) for e in second)

    messages = _read(bootstrap, SOURCE.name)
    valid = []
    for m in messages:
        try:
            valid.append({**decode(TransactionEvent, m.value()).model_dump(), "partition": m.partition(), "offset": m.offset()})
        except ValueError:
            pass
    accepted, late = split_late(pd.DataFrame(valid), plan.out_of_orderness_ms)
    assert len(late) > 10, "the stream should plant late events"
    expected = {view.name: recompute(view, accepted) for view in plan.views}
    assert all(len(frame) > 30 for frame in expected.values()), "many entities to compare"
    store = feature_store(settings.registry_path, settings.redis_address)

    job = _start_job(settings, job_group)  # resumes from the last checkpoint
    try:
        problems: list[str] = []

        def agrees() -> bool:
            problems[:] = _differences(plan, store, expected)
            return not problems

        try:
            _wait(agrees, 240, "online features to equal the offline recompute")
        except AssertionError:
            pytest.fail(f"{len(problems)} online values differ from the recompute, e.g. {problems[:5]}")
    finally:
        stop_feature_job(job, signal.SIGKILL)

    offline = pd.concat(pd.read_parquet(part) for part in (settings.home / "offline" / "user_transaction_features").glob("*.parquet"))
    assert {"user_id", "event_timestamp", "txn_count_5m"} <= set(offline.columns)
    assert set(offline["user_id"]) <= set(expected["user_transaction_features"]["user_id"])

    letters = [decode(DeadLetterRecord, m.value()) for m in _read(bootstrap, DEAD.name)]
    ours = {(d.source_partition, d.source_offset): d for d in letters if d.source_topic == SOURCE.name}
    late_positions = {(d.source_partition, d.source_offset) for d in ours.values() if d.reason == "late"}
    assert late_positions == set(zip(late["partition"], late["offset"])), "exactly the late events are dead-lettered"
    invalid = {d.key: d for d in ours.values() if d.reason == "invalid"}
    assert invalid["bad-not json"].error_field == "<payload>"
    assert invalid["bad-wrong type"].error_field == "amount"
    assert invalid["bad-unknown version"].error_field == "schema_version"
    assert len([d for d in ours.values() if d.reason == "invalid"]) == len(messages) - len(valid)
