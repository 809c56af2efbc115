"""Versioned snapshots: content-addressed ids, immutable folders, manifests with reference statistics, diffs, backfill.

Examples come from a real Kafka topic (as the joiner writes them) and the backfill from the real
event log with the offline recompute.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from feedback_loop.example_log import backfill_examples, logged_examples
from feedback_loop.snapshots import SnapshotError, diff_snapshots, examples_frame, list_snapshots, read_snapshot, write_snapshot
from loopline.components import feature_plan
from loopline.settings import Settings
from schemas.records import TrainingExample
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import encode
from streams.producer import EventProducer
from streams.topics import apply_topics, read_topic
from streams.world import Emitted
from tests.support.templates import FRAUD, LABELS, TRANSACTIONS, fraud_world

INPUTS = ["user_transaction_features:txn_count_5m", "request:amount"]


def _examples(n: int, seed: int, shift: float = 0.0) -> list[TrainingExample]:
    rng = np.random.default_rng(seed)
    start = int(time.time() * 1000) - 2 * DAY_MS
    return [
        TrainingExample(
            schema_version=1,
            event_id=f"e{seed}-{i}",
            request_id=f"r{seed}-{i}",
            entity_keys={"user_id": f"u{i % 40}"},
            features={INPUTS[0]: int(rng.poisson(3)), INPUTS[1]: float(rng.lognormal(3 + shift, 1))},
            model_name="fraud",
            model_version="1",
            score=float(rng.random()),
            label=None if i % 7 == 0 else float(i % 11 == 0),
            requested_at_ms=start + i * 60_000,
            predicted_at_ms=start + i * 60_000 + 5,
            label_time_ms=None if i % 7 == 0 else start + i * 60_000 + 9_000,
            joined_at_ms=start + i * 60_000 + 9_100,
        )
        for i in range(n)
    ]


def test_snapshot_ids_follow_the_content(applied: Settings, tmp_path: Path) -> None:
    topic = TopicSpec(f"test.examples.{uuid.uuid4().hex[:6]}", TrainingExample, key="event_id", partitions=3, retention_ms=DAY_MS)
    bootstrap = applied.kafka.bootstrap
    apply_topics(bootstrap, [topic])
    examples = _examples(3_000, seed=1)
    EventProducer(bootstrap).publish(Emitted(topic.name, e.event_id, encode(e), e.predicted_at_ms, e) for e in examples)

    logged, source = logged_examples(bootstrap, topic.name, None, None)
    assert len(logged) == 3_000 and sum(last - first + 1 for first, last in source["offsets"].values()) == 3_000
    root = str(tmp_path / "snapshots")
    first = write_snapshot(
        examples_frame(logged), root, kind="feedback", source=source, time_range={"from_ms": None, "to_ms": None}
    )
    # The same examples in another order, read again: the same snapshot, written once.
    again = write_snapshot(
        examples_frame(list(reversed(logged))), root, kind="feedback", source=source, time_range={"from_ms": None, "to_ms": None}
    )
    assert again.snapshot_id == first.snapshot_id and len(list_snapshots(root)) == 1
    # One label changed: another snapshot.
    changed = [e.model_copy(update={"label": 1.0 - e.label}) if i == 5 else e for i, e in enumerate(logged)]
    other = write_snapshot(
        examples_frame(changed), root, kind="feedback", source=source, time_range={"from_ms": None, "to_ms": None}
    )
    assert other.snapshot_id != first.snapshot_id and len(list_snapshots(root)) == 2

    assert first.rows == 3_000 and first.features == INPUTS
    balance = first.label_balance
    assert balance["unlabeled"] == sum(e.label is None for e in examples)
    assert balance["positive"] + balance["negative"] + balance["unlabeled"] == 3_000
    reference = first.reference[INPUTS[1]]
    assert len(reference.edges) == 9 and sum(reference.shares) == pytest.approx(1.0)
    assert all(abs(share - 0.1) < 0.02 for share in reference.shares), "decile bins of its own data hold a tenth each"
    manifest, frame = read_snapshot(root, first.snapshot_id[:8])
    assert manifest == first and len(frame) == 3_000 and frame["event_id"].is_unique
    assert sorted(p.name for p in (tmp_path / "snapshots" / first.snapshot_id / "data").iterdir())[0].startswith("date=")

    # A time range takes only the examples scored within it.
    cut = examples[1_000].predicted_at_ms
    assert len(logged_examples(bootstrap, topic.name, cut, None)[0]) == 2_000

    shifted = write_snapshot(
        examples_frame(_examples(3_000, seed=2, shift=1.0)),
        root,
        kind="feedback",
        source={},
        time_range={"from_ms": None, "to_ms": None},
    )
    diff = diff_snapshots(root, first.snapshot_id, shifted.snapshot_id)
    assert diff["features"][INPUTS[1]]["psi"] > 0.25, "a shifted amount distribution shows as drift"
    assert diff["features"][INPUTS[0]]["psi"] < 0.1, "an unchanged count distribution does not"
    with pytest.raises(SnapshotError, match="no snapshot"):
        read_snapshot(root, "ffffffff")


def test_a_snapshot_keeps_categories_and_one_example_per_event_whatever_the_order(tmp_path: Path) -> None:
    examples = _examples(200, seed=3)
    channel, flagged = "request:channel", "request:flagged"
    examples = [
        e.model_copy(update={"features": e.features | {channel: ["web", "app", None][i % 3], flagged: i % 2 == 0}})
        for i, e in enumerate(examples)
    ]
    # A prediction scored twice (a retried request): the earlier scoring is the example, in any order.
    retried = examples[7].model_copy(
        update={"request_id": "r-retry", "predicted_at_ms": examples[7].predicted_at_ms + 50, "score": 0.5}
    )
    time_range = {"from_ms": None, "to_ms": None}
    one = write_snapshot(
        examples_frame([*examples, retried]), str(tmp_path / "a"), kind="feedback", source={}, time_range=time_range
    )
    two = write_snapshot(
        examples_frame([retried, *reversed(examples)]), str(tmp_path / "b"), kind="feedback", source={}, time_range=time_range
    )
    assert one.snapshot_id == two.snapshot_id and one.rows == 200

    _, frame = read_snapshot(str(tmp_path / "a"), one.snapshot_id)
    assert frame.set_index("event_id").loc[examples[7].event_id, "request_id"] == examples[7].request_id
    assert frame[channel].value_counts().to_dict() == {"web": 67, "app": 67} and frame[channel].isna().sum() == 66
    assert frame[flagged].isin([0.0, 1.0]).all() and frame[flagged].sum() == 100
    reference = one.reference[channel]
    assert reference.kind == "categorical" and reference.values == pytest.approx({"app": 0.5, "web": 0.5}, abs=0.01)
    assert reference.missing_rate == pytest.approx(1 / 3, abs=0.01)
    assert one.reference[flagged].kind == "numeric" and one.reference[flagged].mean == pytest.approx(0.5)


def test_backfill_builds_labeled_examples_point_in_time_from_the_event_log(applied: Settings, tmp_path: Path) -> None:
    bootstrap = applied.kafka.bootstrap
    run = uuid.uuid4().hex[:6]
    transactions = TopicSpec(f"test.bf.tx.{run}", TRANSACTIONS.record_type, key="user_id", partitions=2, retention_ms=DAY_MS)
    labels = TopicSpec(f"test.bf.labels.{run}", LABELS.record_type, key="event_id", partitions=1, retention_ms=DAY_MS)
    apply_topics(bootstrap, [transactions, labels])
    stream = fraud_world(
        3,
        int(time.time() * 1000) - 3_600_000,
        users=50,
        merchants=20,
        rate_per_s=100,
        late_rate=0.0,
        out_of_order_rate=0.0,
        legit_label_rate=0.3,
    )
    emitted = list(itertools.islice(stream, 3_000))
    routed = {TRANSACTIONS.name: transactions.name, LABELS.name: labels.name}
    EventProducer(bootstrap).publish(
        Emitted(routed[e.topic], e.key, e.value, e.emit_at_ms, e.record) for e in emitted if e.topic in routed
    )

    plan = feature_plan(applied)
    frame = backfill_examples(
        plan.reading({TRANSACTIONS.name: transactions.name}),
        FRAUD,
        {transactions.name: read_topic(bootstrap, transactions.name)},
        read_topic(bootstrap, labels.name),
        INPUTS,
        scored_topic=transactions.name,
    )
    labeled = {e.record.event_id: e.record for e in emitted if e.topic == LABELS.name}
    assert len(frame) == len({e for e in labeled}) and frame["label"].notna().all()
    one = frame.iloc[len(frame) // 2]
    event = next(e.record for e in emitted if e.topic == TRANSACTIONS.name and e.record.event_id == one["event_id"])
    assert one["request:amount"] == event.amount and one["label"] == float(labeled[event.event_id].is_fraud)
    # The user's 5-minute count at that transaction, recounted here from the events.
    mine = [e.record.event_time_ms for e in emitted if e.topic == TRANSACTIONS.name and e.record.user_id == event.user_id]
    bucket = event.event_time_ms // 10_000
    assert one[INPUTS[0]] == sum(1 for t in mine if bucket - 30 < t // 10_000 <= bucket and t <= event.event_time_ms)
    manifest = write_snapshot(
        frame, str(tmp_path), kind="backfill", source={"backfill": True}, time_range={"from_ms": None, "to_ms": None}
    )
    assert manifest.kind == "backfill" and json.loads(manifest.to_json())["rows"] == len(frame)
