"""The feedback joiner: predictions ⋈ late labels → one training example per scored event, through a SIGKILL.

Real Kafka and Flink (`loopline feedback join` in a subprocess). Records carry explicit Kafka
timestamps (the joiner's event time), so the 20-second horizon is crossed without waiting for it:
labels within the horizon, labels before their prediction, labels past the horizon, events never
labeled, predictions scored twice (a retried request), and a bad record of each topic.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.service import wait_until
from loopline.job_processes import start_joiner, stop_process_group
from loopline.settings import Settings
from schemas.records import DeadLetterRecord, PredictionRecord, TrainingExample
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import decode, encode
from streams.topics import apply_topics, read_topic
from tests.support.templates import LabelEvent

RUN = uuid.uuid4().hex[:6]
PREDICTIONS = TopicSpec(f"test.fb.predictions.{RUN}", PredictionRecord, key="request_id", partitions=3, retention_ms=DAY_MS)
LABELS = TopicSpec(f"test.fb.labels.{RUN}", LabelEvent, key="event_id", partitions=2, retention_ms=DAY_MS)
EXAMPLES = TopicSpec(f"test.fb.examples.{RUN}", TrainingExample, key="event_id", partitions=3, retention_ms=DAY_MS)
DEAD = TopicSpec(f"test.fb.dlq.{RUN}", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
HORIZON_S = 20
#: Examples commit with each checkpoint: 5 s keeps a batch of them in an open transaction for seconds, long enough for
#: the crash below to find one (at 1 s the last batch's window, a few hundred ms, was missed once in CI).
CHECKPOINT_MS = 5_000
#: Within a labels partition the labels below come up to HORIZON_S + 13 s out of order (an after-the-horizon label, then
#: a label that precedes its prediction a few events on). The joiner is told so, with room to spare: at its 5 s
#: default, a watermark rebuilt from the records read after a restore could pass an event's horizon before its label,
#: read a moment later, was seen. (The tails below are placed this far further on, so they still move the watermark
#: past every horizon they are meant to.)
OUT_OF_ORDER_S = HORIZON_S + 20
T0 = int(time.time() * 1000) - 600_000


def _prediction(event: str, request: str, at_ms: int) -> PredictionRecord:
    return PredictionRecord(
        schema_version=1,
        request_id=request,
        entity_keys={"user_id": f"u-{event}"},
        features={"f:x": 1.5, "request:amount": 3.0},
        model_name="fraud",
        model_version="1",
        score=0.25,
        requested_at_ms=at_ms - 5,
        scored_at_ms=at_ms,
        event_id=event,
    )


def _label(event: str, fraud: bool, at_ms: int) -> LabelEvent:
    return LabelEvent(
        schema_version=1,
        event_id=event,
        user_id=f"u-{event}",
        is_fraud=fraud,
        label_time_ms=at_ms,
        source="chargeback" if fraud else "manual_review",
    )


def test_every_scored_event_yields_one_example_through_a_crash(applied: Settings, tmp_path: Path) -> None:
    bootstrap = applied.kafka.bootstrap
    apply_topics(bootstrap, [PREDICTIONS, LABELS, EXAMPLES, DEAD])
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    def send(topic: TopicSpec, key: str, value: bytes, at_ms: int, partition: int | None = None) -> None:
        extra = {} if partition is None else {"partition": partition}
        producer.produce(topic.name, value, key, timestamp=at_ms, **extra)

    horizon_ms = HORIZON_S * 1000
    expected: dict[str, bool | None] = {}

    def publish(events: range, tail_at: int) -> None:
        """Events ``events`` of every kind, then a record on every partition at ``tail_at``: the watermark moves past
        their horizons (each tail prediction is an event of its own, unlabeled once a later tail moves past it)."""
        for n in events:
            event, at = f"ev-{n}", T0 + n * 50
            kind = n % 5
            if kind == 1:  # the label comes first, within the horizon
                send(LABELS, event, encode(_label(event, n % 2 == 0, at - 3_000)), at - 3_000)
            send(PREDICTIONS, f"req-{n}", encode(_prediction(event, f"req-{n}", at)), at)
            if kind == 4:  # a retried request: scored twice, one example
                send(PREDICTIONS, f"req-{n}-retry", encode(_prediction(event, f"req-{n}-retry", at + 700)), at + 700)
            if kind in (0, 4):  # the label comes later, within the horizon
                send(LABELS, event, encode(_label(event, n % 3 == 0, at + 15_000)), at + 15_000)
            if kind == 3:  # the label comes after the horizon: the event is unlabeled
                send(LABELS, event, encode(_label(event, True, at + horizon_ms + 10_000)), at + horizon_ms + 10_000)
            expected[event] = {0: n % 3 == 0, 1: n % 2 == 0, 2: None, 3: None, 4: n % 3 == 0}[kind]
        for partition in range(PREDICTIONS.partitions):
            tail = f"tail-{tail_at}-{partition}"
            send(PREDICTIONS, tail, encode(_prediction(tail, tail, tail_at)), tail_at, partition)
        for partition in range(LABELS.partitions):
            send(LABELS, f"tail-{partition}", encode(_label(f"tail-l-{tail_at}-{partition}", False, tail_at)), tail_at, partition)
        assert producer.flush(30) == 0

    late_ms = OUT_OF_ORDER_S * 1000
    first_tail, last_tail = T0 + 200 * 50 + 3 * horizon_ms + late_ms, T0 + 400 * 50 + 6 * horizon_ms + 2 * late_ms
    send(PREDICTIONS, "bad", b"{not json", T0)
    send(PREDICTIONS, "no-event", encode(_prediction("x", "no-event", T0).model_copy(update={"event_id": None})), T0)
    publish(range(0, 200), first_tail)

    env = {
        "LOOPLINE_FEEDBACK__PREDICTIONS_TOPIC": PREDICTIONS.name,
        "LOOPLINE_FEEDBACK__LABELS_TOPIC": LABELS.name,
        "LOOPLINE_FEEDBACK__EXAMPLES_TOPIC": EXAMPLES.name,
        "LOOPLINE_FEEDBACK__DEAD_LETTER_TOPIC": DEAD.name,
        "LOOPLINE_FEEDBACK__GROUP_ID": f"fb-{RUN}",
        "LOOPLINE_FEEDBACK__HORIZON_S": str(HORIZON_S),
        "LOOPLINE_FEEDBACK__CHECKPOINT_INTERVAL_MS": str(CHECKPOINT_MS),
        "LOOPLINE_FEEDBACK__OUT_OF_ORDERNESS_MS": str(OUT_OF_ORDER_S * 1000),
    }

    def examples() -> list[TrainingExample]:
        return [decode(TrainingExample, m.value()) for m in read_topic(bootstrap, EXAMPLES.name)]

    joiner = start_joiner(applied, tmp_path / "joiner.log", **env)
    try:
        assert wait_until(lambda: len(examples()) >= 100 or joiner.poll() is not None, 180, 0.5), f"see {tmp_path / 'joiner.log'}"
        publish(range(200, 400), last_tail)
        expected |= {f"tail-{first_tail}-{partition}": None for partition in range(PREDICTIONS.partitions)}
        # Kill while examples sit in an open transaction (written, not yet committed by a checkpoint): they must come
        # back once, from the restored state, not twice and not never.
        assert wait_until(lambda: _uncommitted(bootstrap, EXAMPLES.name) > 0 or joiner.poll() is not None, 120, 0.02)
    finally:
        stop_process_group(joiner, signal.SIGKILL)
    assert len(examples()) < len(expected), "the crash should come before every example is out"

    joiner = start_joiner(applied, tmp_path / "joiner.log", **env)  # resumes from its checkpoint
    try:
        assert wait_until(lambda: len(examples()) >= len(expected), 180, 0.5), f"{len(examples())} of {len(expected)}"
        time.sleep(CHECKPOINT_MS / 1000 + 1)  # a stray duplicate, if the design allowed one, would show now
        logged = examples()
    finally:
        stop_process_group(joiner)

    counts = Counter(e.event_id for e in logged)
    assert set(counts) == set(expected) and max(counts.values()) == 1, "one example per scored event, none doubled"
    by_event = {e.event_id: e for e in logged}
    assert {event: by_event[event].label for event in expected} == expected
    first_retried = by_event["ev-4"]
    assert first_retried.request_id == "req-4", "the first prediction of a retried request is the example"
    assert by_event["ev-0"].features == {"f:x": 1.5, "request:amount": 3.0} and by_event["ev-0"].label_time_ms == T0 + 15_000
    letters = [decode(DeadLetterRecord, m.value()) for m in read_topic(bootstrap, DEAD.name)]
    assert sorted((d.key, d.reason) for d in letters) == [("bad", "invalid"), ("no-event", "no_event_id")]


def _uncommitted(bootstrap: str, topic: str) -> int:
    """Records of ``topic`` in open transactions: the high watermark (read_uncommitted) minus the last stable offset."""
    marks = []
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"marks-{RUN}", "isolation.level": isolation})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            marks.append([consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions])
        finally:
            consumer.close()
    return sum(high - stable for high, stable in zip(*marks, strict=True))
