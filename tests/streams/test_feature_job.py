"""Streaming features: the Flink job compiled from the fraud project's Feast definitions agrees with the offline
recompute.

Real Kafka, Redis, Flink (PyFlink's mini-cluster, in a `loopline stream submit` subprocess) and Feast.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import shutil
import signal
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import replace

import pandas as pd
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from feature_store.config import apply_definitions, feature_store
from feature_store.online_read import OnlineReader
from infra.service import wait_until
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings
from schemas import DeadLetterRecord, decode, encode
from schemas.topics import DAY_MS, TopicSpec
from streams.feature_plan import FeaturePlan, compile_plan
from streams.producer import EventProducer
from streams.recompute import LATEST_EVENT, accepted_events, feature_differences, overflowing, recompute, same_feature_value
from streams.topics import read_topic
from streams.world import Emitted
from tests.support.flink_metrics import FLINK_METRICS
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent, fraud_world
from tests.support.window_definition import window_by_definition

SOURCE = TopicSpec("test.features", TransactionEvent, key="user_id", partitions=3, retention_ms=DAY_MS)
DEAD = TopicSpec("test.features.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
START_MS = int(time.time() * 1000) - 600_000
STREAM = {"rate_per_s": 200, "out_of_order_rate": 0.1, "late_rate": 0.02, "malformed_rate": 0.01, "users": 300, "merchants": 40}
BATCH = 1_500
EVENT_TIME = "event_time_ms"


def _bad_records(newest_ms: int) -> list[Emitted]:
    """Records the job refuses: invalid, out of range, and (valid, stamped ``newest_ms``, the newest event time before
    them, so not late) an overflow."""
    good = json.loads(next(e for e in fraud_world(99, START_MS, **STREAM) if e.record).value)
    cases = {
        "not json": b"{this is not json",
        "wrong type": json.dumps({**good, "amount": "twelve"}).encode(),
        "unknown version": json.dumps({**good, "schema_version": 7}).encode(),
        "too deep": b"[" * 100_000 + b"]" * 100_000,
        # Valid by the contract, but beyond what the engine sums exactly.
        "out of range": json.dumps({**good, "event_id": "huge", "amount": 1e300}).encode(),
    }
    bad = [Emitted(SOURCE.name, f"bad-{name}", value, START_MS, None) for name, value in cases.items()]
    # Valid, each within range, but twelve in one tile of one user total past what its 24-hour window sums exactly.
    big = {**good, "user_id": OVERFLOW_USER, "merchant_id": "overflow-merchant", "amount": 9e9, "event_time_ms": newest_ms}
    return bad + [
        Emitted(SOURCE.name, OVERFLOW_USER, json.dumps({**big, "event_id": f"big-{i}"}).encode(), newest_ms, None)
        for i in range(12)
    ]


OVERFLOW_USER = "overflow-user"


HOT_USER, HOT_MERCHANT = "hot-user", "hot-merchant"


def _hot_entity(numbers: range, ms_per_event: float) -> list[Emitted]:
    """Events ``numbers`` of one user at one merchant, the n-th at about ``n * ms_per_event`` into the
    stream: five per millisecond, shuffled within groups of 50 (out of order, within the watermark bound)."""
    rng = random.Random(numbers.start)
    events = []
    for n in numbers:
        at = START_MS + int((n // 5) * 5 * ms_per_event)
        event = TransactionEvent(
            schema_version=1,
            event_id=f"hot-{n}",
            event_time_ms=at,
            user_id=HOT_USER,
            merchant_id=HOT_MERCHANT,
            amount=round(rng.uniform(1, 500), 2),
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        events.append(Emitted(SOURCE.name, HOT_USER, encode(event), at, event))
    for start in range(0, len(events), 50):
        group = events[start : start + 50]
        rng.shuffle(group)
        events[start : start + 50] = group
    # Sent in the shuffled order, at the pace of the stream they join.
    return [replace(e, emit_at_ms=START_MS + int(n * ms_per_event)) for n, e in zip(numbers, events, strict=True)]


def _merged(stream: list[Emitted], extra: list[Emitted]) -> list[Emitted]:
    """``extra`` inserted into ``stream`` by emit time (each keeps its own order)."""
    return list(heapq.merge(stream, extra, key=lambda e: e.emit_at_ms))


def _start_job(settings: Settings, group: str):
    return start_feature_job(
        settings,
        settings.home / f"job-{group}.log",
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: SOURCE.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=DEAD.name,
        LOOPLINE_STREAM__GROUP_ID=group,
        LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS="1000",
        LOOPLINE_STREAM__OFFLINE_DIR=str(_offline_root(settings)),
    )


def _counted(metrics_port: int, counter: str) -> float:
    """One of the job's operator counters, summed over subtasks and operators, as Prometheus scrapes it from its reporter."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
    return sum(s.value for f in families if f.name == f"flink_taskmanager_job_task_operator_{counter}" for s in f.samples)


def _offline_root(settings: Settings):
    """Where the job appends offline rows: the FileSource paths of a copy of the repo (see ``_offline_store``)."""
    return settings.home / "repo" / "data" / "offline"


def _offline_store(settings: Settings):
    """Feast on a copy of the repo config, so its FileSources (``data/offline/<view>``) resolve to the test's log."""
    repo = settings.home / "repo"
    repo.mkdir(exist_ok=True)
    shutil.copy(settings.repo_path / "feature_store.yaml", repo)
    return feature_store(settings.feast_registry_path, settings.redis_connection, repo)


def _offline_rows(settings: Settings, view: str) -> pd.DataFrame:
    # The folder read the way Feast's file source reads it: pyarrow skips hidden files, such as the
    # half-written one a job killed mid-append leaves behind.
    folder = _offline_root(settings) / view
    return pd.read_parquet(folder) if any(folder.glob("part-*.parquet")) else pd.DataFrame()


def _committed(bootstrap: str, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    partitions = [TopicPartition(SOURCE.name, p) for p in range(SOURCE.partitions)]
    offsets = consumer.committed(partitions, timeout=10)
    consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def _wait(condition, timeout_s: float, what: str) -> None:
    assert wait_until(condition, timeout_s, interval_s=0.5), f"timed out after {timeout_s:.0f} s waiting for {what}"


def _online(store):
    def read(view, offline: pd.DataFrame) -> pd.DataFrame:
        rows = [{view.entity_key: k} for k in offline[view.entity_key]]
        return store.get_online_features(features=[f"{view.name}:{f}" for f in view.feature_names], entity_rows=rows).to_df()

    return read


#: How long after each entity's latest event the request-time reads are: inside its slides, across them, past the
#: 5-minute and hour windows, and past every window (all empty).
READ_AFTER_MS = (0, 7_000, 65_000, 290_000, 3_700_000, 30 * 3_600_000)


def _request_time_differences(plan: FeaturePlan, accepted: pd.DataFrame, reader: OnlineReader) -> list[str]:
    """Every (view, entity, feature, read time) where the online read at that time differs from the window definition
    over the accepted events the view's windows absorb (not those they refuse as an overflow)."""
    problems = []
    for view in plan.views:
        absorbed = accepted[~overflowing(view, view.with_entity(accepted))]
        history = {key: group.to_dict("records") for key, group in absorbed.groupby(view.entity_key)}
        windowed = [a for a in view.aggregations if a.window_ms is not None]
        for after in READ_AFTER_MS:
            at = [max(e[EVENT_TIME] for e in events) + after for events in history.values()]
            values, *_ = reader.read_with_row_times(
                [f"{view.name}:{a.name}" for a in windowed], [{view.entity_key: k} for k in history], at
            )
            for aggregation in windowed:
                for entity, events, at_ms, got in zip(history, history.values(), at, values[aggregation.name], strict=True):
                    want = window_by_definition(aggregation, events, at_ms)
                    if not same_feature_value(aggregation.name, want, got):
                        problems.append(
                            f"{view.name}[{entity}].{aggregation.name} at +{after} ms: online {got}, by definition {want}"
                        )
    return problems


def _historical(store):
    """Feast's point-in-time retrieval from the offline log, at each entity's latest event.

    A row's timestamp is its version: the entity's latest event time, plus a microsecond for each event
    absorbed since (fewer than 1,000 here), so the query time is the event's millisecond plus 999 µs.
    """

    def read(view, offline: pd.DataFrame) -> pd.DataFrame:
        at = pd.to_datetime(offline[LATEST_EVENT] * 1000 + 999, unit="us", utc=True)
        entities = pd.DataFrame({view.entity_key: offline[view.entity_key], "event_timestamp": at})
        features = [f"{view.name}:{f}" for f in view.feature_names]
        return store.get_historical_features(entity_df=entities, features=features).to_df().drop(columns="event_timestamp")

    return read


@pytest.fixture(scope="module")
def plan(settings: Settings, bootstrap: str) -> FeaturePlan:
    from streams.topics import apply_topics

    apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    apply_topics(bootstrap, [SOURCE, DEAD])
    # Other tests write rows for the same synthetic entities with newer event times; this test
    # compares the whole online store with its own recompute, so it starts from an empty one.
    redis.Redis(port=settings.redis.port).flushdb()
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    return compile_plan(store.list_stream_feature_views(), FRAUD).reading({TRANSACTIONS.name: SOURCE.name})


def test_stream_equals_recompute_through_a_crash(settings: Settings, bootstrap: str, plan: FeaturePlan) -> None:
    job_group = f"test-features-{uuid.uuid4()}"
    stream = iter(fraud_world(5, START_MS, **STREAM))
    first = [replace(e, topic=SOURCE.name) for e in itertools.islice(stream, BATCH) if e.topic == "events.transactions"]
    ms_per_hot_event = (first[-1].emit_at_ms - first[0].emit_at_ms) / 1_500
    producer = EventProducer(bootstrap)
    batch = _merged(first, _hot_entity(range(0, 1_500), ms_per_hot_event))
    producer.publish(batch + _bad_records(max(e.record.event_time_ms for e in batch if e.record is not None)))

    job = _start_job(settings, job_group)
    try:
        _wait(lambda: _committed(bootstrap, job_group) >= len(first) // 2, 180, "a checkpoint covering part of the first batch")
    finally:
        stop_process_group(job, signal.SIGKILL)  # mid-stream, without warning

    second = [replace(e, topic=SOURCE.name) for e in itertools.islice(stream, BATCH) if e.topic == "events.transactions"]
    producer.publish(_merged(second, _hot_entity(range(1_500, 3_000), ms_per_hot_event)))

    messages = read_topic(bootstrap, SOURCE.name)
    accepted, late = accepted_events(plan, SOURCE.name, messages)
    assert len(late) > 10, "the stream should plant late events"
    sent_after_the_crash = {e.record.event_id for e in second if e.record is not None}
    assert late["event_id"].isin(sent_after_the_crash).any(), "... also among those sent after the crash"
    hot = accepted[accepted["user_id"] == HOT_USER]
    assert len(hot) > 2_500 and hot["event_time_ms"].duplicated().sum() > 2_000, "one entity with many events in the same ms"
    assert (hot["event_time_ms"].diff() < 0).sum() > 500, "... many of them out of order"
    expected = {view.name: recompute(view, accepted) for view in plan.views}
    assert all(len(frame) > 30 for frame in expected.values()), "many entities to compare"
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)

    job = _start_job(settings, job_group)  # resumes from the last checkpoint (metrics on settings.stream.metrics_port)
    try:
        problems: list[str] = []

        def agrees() -> bool:
            problems[:] = feature_differences(plan, expected, _online(store))
            return not problems

        try:
            _wait(agrees, 240, "online features to equal the offline recompute")
        except AssertionError:
            pytest.fail(f"{len(problems)} online values differ from the recompute, e.g. {problems[:5]}")

        # Read later, with no new event: the windows empty tile by tile, from the tiles written through the crash.
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)

        def request_time_agrees() -> bool:
            problems[:] = _request_time_differences(plan, accepted, reader)
            return not problems

        try:
            _wait(request_time_agrees, 60, "request-time reads to equal the window definition")
        except AssertionError:
            pytest.fail(f"{len(problems)} request-time values differ from the definition, e.g. {problems[:5]}")

        # The restarted job's counter starts at zero, and the events sent after the crash hold late ones.
        _wait(
            lambda: _counted(settings.stream.metrics_port, "late_events") > 0,
            30,
            "late events counted on the job's Prometheus endpoint",
        )
        # The JVM writer counts the rows it has written on the same endpoint.
        assert _counted(settings.stream.metrics_port, "feature_rows_written") > 0
        # The alert rules' freshness and lag metrics (tests/infra/test_prometheus_rules.py) are what the job's reporter exports.
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.stream.metrics_port}/metrics", timeout=5) as response:
            exported = {family.name for family in text_string_to_metric_families(response.read().decode())}
        assert exported >= FLINK_METRICS, FLINK_METRICS - exported

        def logged_offline() -> bool:  # every entity's newest row, appended within the offline flush interval
            for view in plan.views:
                rows = _offline_rows(settings, view.name)
                if rows.empty:
                    return False
                logged_us = rows.groupby(view.entity_key)["event_timestamp"].max().astype("int64") // 1000
                wanted_us = expected[view.name].set_index(view.entity_key)[LATEST_EVENT] * 1000
                if not (logged_us.reindex(wanted_us.index) >= wanted_us).all():
                    return False
            return True

        _wait(logged_offline, 60, "the newest rows in the offline log")
    finally:
        stop_process_group(job, signal.SIGKILL)

    problems = feature_differences(plan, expected, _historical(_offline_store(settings)))
    assert not problems, f"{len(problems)} historical values differ from the recompute, e.g. {problems[:5]}"

    # Every event of the hot user got a version of its own (the offline log holds each row, a replayed
    # one possibly twice, identical), so none was skipped by the online store as "not newer".
    versions = _offline_rows(settings, "user_transaction_features").query("user_id == @HOT_USER")["event_timestamp"]
    assert versions.nunique() == len(hot), f"{versions.nunique()} distinct row versions for {len(hot)} events"

    letters = [decode(DeadLetterRecord, m.value()) for m in read_topic(bootstrap, DEAD.name)]
    ours = Counter((d.source_partition, d.source_offset) for d in letters if d.source_topic == SOURCE.name)
    assert max(ours.values()) == 1, "each dead letter committed once, though the job was killed and replayed"
    by_position = {(d.source_partition, d.source_offset): d for d in letters if d.source_topic == SOURCE.name}
    late_positions = {p for p, d in by_position.items() if d.reason == "late"}
    assert late_positions == set(zip(late["partition"], late["offset"], strict=True)), "exactly the late events are dead-lettered"
    refused = {d.key: d for d in by_position.values() if d.reason in ("invalid", "out_of_range")}
    assert refused["bad-not json"].error_field == "<payload>"
    assert refused["bad-wrong type"].error_field == "amount"
    assert refused["bad-unknown version"].error_field == "schema_version"
    assert refused["bad-too deep"].error_field == "<payload>"
    assert (refused["bad-out of range"].reason, refused["bad-out of range"].error_field) == ("out_of_range", "amount")
    assert sum(d.reason in ("invalid", "out_of_range") for d in by_position.values()) == len(messages) - len(accepted) - len(late)
    # The windows refuse what would pass an exact total, as the recompute does (and so agreed above without them).
    overflowed = {(d.source_partition, d.source_offset) for d in by_position.values() if d.reason == "overflow"}
    assert all((d.key, d.error_field) == (OVERFLOW_USER, "amount") for d in by_position.values() if d.reason == "overflow")
    refusals = {view.name: accepted[overflowing(view, view.with_entity(accepted))] for view in plan.views}
    assert overflowed == {(p, o) for frame in refusals.values() for p, o in zip(frame["partition"], frame["offset"], strict=True)}
    assert len(refusals["user_transaction_features"]) == 2 and refusals["merchant_transaction_features"].empty, (
        "10 fit a 96-tile window"
    )
