"""The incremental reader of the event log (`streams.event_log.EventLogWindow`) gives what a full read gives.

On the session's Kafka: events published in rounds over several partitions, out of order, late, far behind (older
than the window), with junk, out-of-range records and aborted transactions among them. After each round the reader's
accepted and late events equal, row for row, those `accepted_events` finds in a full read of the topic from the same
start, at the event times the reader keeps; each call after the first reads only the records published since. And the
rule that lets old events go, against `split_late` on the whole frame (Hypothesis).
"""

from __future__ import annotations

import json
import random
import time
import uuid

import pandas as pd
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import encode
from schemas.topics import DAY_MS, TopicSpec
from streams.event_log import EventLogWindow, events_since
from streams.feature_plan import MAX_EVENT_TIME_MS, AggregationSpec, FeaturePlan
from streams.recompute import accepted_events, split_late
from streams.topics import apply_topics, read_topic
from tests.support.templates import EVENT_TIME, TransactionEvent, fraud_plan, view_plan

OUT_OF_ORDERNESS_MS, ROUND_MS, PARTITIONS = 5_000, 60_000, 3


def _plan(topic: str) -> FeaturePlan:
    view = view_plan(
        "user_features",
        (AggregationSpec("amount_sum_5m", "sum", "amount", 5 * ROUND_MS, 10_000),),
        topic=topic,
        out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
    )
    return fraud_plan(view, topic=topic, out_of_orderness_ms=OUT_OF_ORDERNESS_MS)


def _event(n: int, at_ms: int, rng: random.Random) -> bytes:
    return encode(
        TransactionEvent(
            schema_version=1,
            event_id=f"e{n}",
            event_time_ms=at_ms,
            user_id=f"u{rng.randrange(20)}",
            merchant_id="m1",
            amount=round(rng.uniform(1, 300), 2),
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
    )


def _round(rng: random.Random, first_ms: int, count: int, numbered: int) -> list[tuple[int, int, bytes]]:
    """``(partition, Kafka timestamp, value)`` of one round's records, sent one ``ROUND_MS`` from ``first_ms``: events
    mostly a little after their time, some out of order within the bound, some late, some far older than the window,
    a partition whose events all come 30 s behind the others' (late only by its own events); junk and events out of the
    engine's range among them."""
    records = []
    for i in range(count):
        sent, partition = first_ms + i * ROUND_MS // count, rng.randrange(PARTITIONS)
        delay = rng.choice(
            [rng.randrange(0, 1_000)] * 6
            + [rng.randrange(1_000, 4_000), rng.randrange(8_000, 40_000), rng.randrange(5 * ROUND_MS, 20 * ROUND_MS)]
        )
        value = _event(numbered + i, sent - delay - (30_000 if partition == 2 else 0), rng)
        if i % 50 == 7:
            value = rng.choice(
                [
                    b"not json",
                    b'{"schema_version": 1}',
                    b"[]",
                    _event(numbered + i, MAX_EVENT_TIME_MS + 1, rng),
                    json.dumps({**json.loads(value), "amount": 1e300}).encode(),
                ]
            )
        records.append((partition, sent, value))
    return records


def _publish(producer: Producer, topic: str, records: list[tuple[int, int, bytes]], commit: bool) -> None:
    producer.begin_transaction()
    for partition, sent, value in records:
        producer.produce(topic, value, b"k", partition=partition, timestamp=sent)
    # Delivered first: aborting with records still in flight made Kafka 4.4 answer INVALID_TXN_STATE (fatal) once in two runs.
    assert producer.flush(30) == 0
    producer.commit_transaction() if commit else producer.abort_transaction()


def _full_read(plan: FeaturePlan, bootstrap: str, started_ms: int) -> tuple[int, tuple[pd.DataFrame, pd.DataFrame]]:
    """How many records a full read from ``started_ms`` (Kafka time) finds, and its accepted and late events."""
    messages = read_topic(bootstrap, plan.topics[0], since_ms=started_ms)
    return len(messages), accepted_events(plan, plan.topics[0], messages)


def test_the_incremental_reader_keeps_the_full_reads_verdicts_and_reads_each_record_once(bootstrap: str) -> None:
    topic = TopicSpec(
        f"test.event-log.{uuid.uuid4().hex[:8]}", TransactionEvent, key="user_id", partitions=PARTITIONS, retention_ms=DAY_MS
    )
    apply_topics(bootstrap, [topic])
    plan, rng = _plan(topic.name), random.Random(5)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"event-log-{topic.name}", "linger.ms": 5})
    producer.init_transactions()
    log = EventLogWindow(plan, plan.topics[0], bootstrap)
    base = int(time.time() * 1000) - 30 * ROUND_MS  # Kafka refuses timestamps much ahead of its clock, not behind it
    # The window's floor per round: forward, back before the last floor (the reader starts again), forward again.
    floors = [base + 30_000, base + 70_000, base + 110_000, base + 40_000, base + 150_000, base + 150_000]
    started, numbered = floors[0], 0
    for round_index, since in enumerate(floors):
        records = [] if round_index == 5 else _round(rng, base + round_index * ROUND_MS, 300, numbered)
        numbered += len(records)
        # Committed, aborted (events that would make others late if they counted), committed; a round may end aborted.
        poison = [(p, base + round_index * ROUND_MS, _event(-1, base + 40 * ROUND_MS, rng)) for p in range(PARTITIONS)]
        _publish(producer, topic.name, records[:200], commit=True)
        _publish(producer, topic.name, poison, commit=False)
        _publish(producer, topic.name, records[200:], commit=True)
        if round_index % 2:
            _publish(producer, topic.name, poison, commit=False)

        accepted, late = log.events(since)
        starts_again = round_index == 0 or since < floors[round_index - 1]
        started = since if starts_again else started
        read, full = _full_read(plan, bootstrap, started)
        want_accepted, want_late = (events_since(frame, since, EVENT_TIME).reset_index(drop=True) for frame in full)
        pd.testing.assert_frame_equal(accepted.reset_index(drop=True), want_accepted, check_exact=True)
        pd.testing.assert_frame_equal(late.reset_index(drop=True), want_late, check_exact=True)
        assert len(want_accepted) > 50 and len(want_late) > 0, round_index
        assert sum(len(frame) - len(events_since(frame, since, EVENT_TIME)) for frame in full) > 0, (
            f"round {round_index}: nothing let go"
        )
        # A first read reads from the floor by Kafka time; a later one only this round's committed records.
        assert log.records_read == (read if starts_again else len(records)), round_index


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), max_size=60),
    st.integers(0, 10),
    st.integers(-5, 65),
)
def test_letting_events_older_than_the_floor_go_changes_no_verdict_on_the_rest(
    events: list[tuple[int, int]], out_of_orderness_ms: int, floor_ms: int
) -> None:
    frame = pd.DataFrame(
        {"partition": [p for p, _ in events], "offset": range(len(events)), EVENT_TIME: [t for _, t in events]}, dtype="int64"
    )
    kept_accepted, kept_late = split_late(events_since(frame, floor_ms, EVENT_TIME), out_of_orderness_ms, EVENT_TIME)
    all_accepted, all_late = split_late(frame, out_of_orderness_ms, EVENT_TIME)
    pd.testing.assert_frame_equal(kept_accepted, events_since(all_accepted, floor_ms, EVENT_TIME))
    pd.testing.assert_frame_equal(kept_late, events_since(all_late, floor_ms, EVENT_TIME))
