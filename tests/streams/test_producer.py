"""The producer, and the fraud template's synthetic world it publishes: deterministic for a seed, realistic patterns,
labels of real events, all delivered."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, TopicPartition

from schemas.topics import DAY_MS, TopicSpec
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted, WorldConfig
from tests.support.paths import REPO
from tests.support.templates import FRAUD, LABELS, TRANSACTIONS, TransactionEvent, fraud_world

START_MS = 1_760_000_000_000
#: A topic of the pacing test's own (its records are not transactions: the session's feature jobs read that topic).
PACING = TopicSpec(f"test.pacing.{uuid.uuid4().hex[:8]}", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)
CONFIG = {"rate_per_s": 2_000, "malformed_rate": 0.01}


def first(n: int, seed: int, **options) -> list[Emitted]:
    return list(itertools.islice(fraud_world(seed, START_MS, **(options or CONFIG)), n))


def test_same_seed_same_events_across_processes() -> None:
    digest = hashlib.sha256(b"".join(e.topic.encode() + e.key.encode() + e.value for e in first(5_000, 11)))
    script = (
        "import hashlib, itertools\n"
        "from tests.support.templates import fraud_world\n"
        f"s = fraud_world(11, {START_MS}, rate_per_s=2_000, malformed_rate=0.01)\n"
        "print(hashlib.sha256(b''.join(e.topic.encode() + e.key.encode() + e.value"
        " for e in itertools.islice(s, 5_000))).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env, cwd=REPO)
    assert other.stdout.strip() == digest.hexdigest()
    assert first(200, 12) != first(200, 11)


def test_labels_refer_to_earlier_real_transactions() -> None:
    seen: dict[str, TransactionEvent] = {}
    labels = 0
    for emitted in first(60_000, 3):
        if emitted.topic == TRANSACTIONS.name and emitted.record is not None:
            seen[emitted.record.event_id] = emitted.record
        elif emitted.topic == LABELS.name:
            label = emitted.record
            assert label is not None and emitted.key == label.event_id, "a label is keyed by the event it labels"
            assert label.event_id in seen, "a label must refer to a transaction already emitted"
            assert label.user_id == seen[label.event_id].user_id
            assert label.label_time_ms >= seen[label.event_id].event_time_ms
            labels += 1
    assert labels > 100


def test_stream_has_the_planted_patterns() -> None:
    stream = first(60_000, 5, rate_per_s=2_000, malformed_rate=0.01, label_delay_s=(1.0, 5.0))
    transactions = [e.record for e in stream if e.topic == TRANSACTIONS.name and e.record is not None]
    malformed = [e for e in stream if e.record is None]
    fraud_ids = {e.record.event_id for e in stream if e.topic == LABELS.name and e.record.is_fraud}
    emitted_at = {e.record.event_id: e.emit_at_ms for e in stream if e.topic == TRANSACTIONS.name and e.record}

    behind_s = [(emitted_at[t.event_id] - t.event_time_ms) / 1000 for t in transactions]
    out_of_order = sum(0 < b <= WorldConfig.max_out_of_order_s for b in behind_s) / len(behind_s)
    late = sum(b >= WorldConfig.late_by_s[0] for b in behind_s)
    assert 0.02 < out_of_order < 0.08 and late > 50

    by_user = defaultdict(list)
    for t in transactions:
        if t.event_id in fraud_ids and t.channel == "online":
            by_user[t.user_id].append(t.event_time_ms)
    velocity = [u for u, times in by_user.items() if len(times) >= 5 and max(times) - min(times) <= 150_000]
    assert velocity, "some user should show a velocity burst of fraud"

    typical = defaultdict(list)
    for t in transactions:
        typical[t.user_id].append(t.amount)
    spikes = [
        t
        for t in transactions
        if t.event_id in fraud_ids and t.amount > 8 * sorted(typical[t.user_id])[len(typical[t.user_id]) // 2]
    ]
    assert spikes, "some fraud should be an amount spike"

    assert 0.005 < len(malformed) / len(stream) < 0.02
    assert len({e.key for e in stream}) > 1_000, "many users"
    assert len({t.merchant_id for t in transactions}) > 300, "many merchants"


def test_published_events_are_exactly_the_generated_ones(bootstrap: str) -> None:
    config = {"rate_per_s": 5_000, "malformed_rate": 0.0, "legit_label_rate": 0.5, "label_delay_s": (0.0, 0.5)}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}"})
    topics = consumer.list_topics(timeout=10).topics
    starts = {}
    for topic in (TRANSACTIONS.name, LABELS.name):
        for partition in topics[topic].partitions:
            starts[(topic, partition)] = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]

    stats = EventProducer(bootstrap).publish(fraud_world(21, START_MS, **config), duration_s=2.0)
    expected = list(itertools.takewhile(lambda e: e.emit_at_ms - START_MS < 2_000, fraud_world(21, START_MS, **config)))
    assert stats.total == len(expected)
    assert stats.delivered[LABELS.name] > 0

    consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
    read: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for _ in range(200):
        if sum(len(v) for v in read.values()) >= len(expected):
            break
        for msg in consumer.consume(1000, timeout=0.5):
            assert msg.error() is None
            read[(msg.topic(), msg.key().decode())].append(msg.value())
    consumer.close()
    wanted: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for e in expected:
        wanted[(e.topic, e.key)].append(e.value)
    assert read == wanted, "every record delivered once, in order per key"
    assert all(FRAUD.decoder(TRANSACTIONS.name)(v) for (t, _), vs in read.items() if t == TRANSACTIONS.name for v in vs)


def test_wall_clock_pacing_sends_the_past_at_once_and_the_future_on_time(bootstrap: str) -> None:
    """A stream that starts in the past (the demo's history): what is already due goes at once, the rest when the wall
    clock reaches it, never early. Kafka's create time of each record is when the producer handed it over."""
    topic = PACING.name
    apply_topics(bootstrap, [PACING])
    now_ms = int(time.time() * 1000)
    # 200 records over the last 20 s, then 20 over the next 2 s.
    times = [now_ms - 20_000 + 100 * i for i in range(200)] + [now_ms + 500 + 100 * i for i in range(20)]
    records = [Emitted(topic, f"pace-{uuid.uuid4().hex[:8]}", b"{}", at, None) for at in times]
    EventProducer(bootstrap, linger_ms=1).publish(records, wall_clock=True)
    sent = _create_times(bootstrap, topic, {r.key for r in records})
    history, future = records[:200], records[200:]
    assert max(sent[r.key] for r in history) - now_ms < 1_000, "the past went at once"
    lateness = [sent[r.key] - r.emit_at_ms for r in future]
    assert min(lateness) >= 0, f"a record went before its time: {min(lateness)} ms early"
    assert max(lateness) < 250, f"a record waited {max(lateness)} ms past its time"


def _create_times(bootstrap: str, topic: str, keys: set[str]) -> dict[str, int]:
    """The Kafka create time of the records of ``topic`` keyed ``keys`` (read from the last minute's records)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}"})
    try:
        partitions = [
            TopicPartition(topic, p, int(time.time() * 1000) - 60_000)
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ]
        consumer.assign(consumer.offsets_for_times(partitions, timeout=10))
        found: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while len(found) < len(keys) and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                key = (message.key() or b"").decode()
                if message.error() is None and key in keys:
                    found[key] = message.timestamp()[1]
        assert len(found) == len(keys), f"{len(found)} of {len(keys)} records read back"
        return found
    finally:
        consumer.close()
