"""The training side of the loop on a private stack (127.0.0.1 only): joiner, snapshots, DeepSpeed, and the streaming
features' worth.

1. The feedback joiner (`loopline feedback join`: PyFlink mini-cluster, JVM keyed state, exactly-once Kafka
   sink, checkpoints every second) joins ``scoring.predictions`` with ``events.labels``. Its start-up is not
   measured: a warm-up batch of events is produced as it starts, and the clock starts once all of their
   examples are readable. Then a batch of N events (a prediction and its label each) is produced as fast as
   Kafka takes it; ``joiner_events_per_s`` is 2N records / the time from the first record produced until the
   N-th example is readable by a read_committed consumer. The examples of a checkpoint become readable when it
   completes, so the figure includes up to one checkpoint interval (1 s) of commit delay. Every event must
   yield exactly one labelled example: the count of those that did not is reported.
2. ``snapshot_rows_per_s``: ``write_snapshot`` (canonical form, content hash, partitioned parquet, reference
   statistics, manifest) on the examples the joiner wrote, into a fresh folder.
3. What the streaming features are worth: the fraud template's synthetic world with planted fraud
   (loopline/templates/fraud/world.py, 2,000 users at 5 transactions/s, so a velocity burst stands out of a user's
   history) goes through Kafka, its labelled transactions are backfilled point in time with the offline recompute
   (the feature job's windows), and the demo model's config (the project's model/train.yaml; 8 epochs in full runs) trains
   twice on the same rows and time split: with the user's streaming features and the request fields, and with
   the request fields alone. ``auc_gain`` and ``auc_ratio`` are computed here from the two holdout AUCs.
4. ``train_samples_per_s``: DeepSpeed on this CPU (ZeRO 1, 2 processes under torchrun, gloo), the streaming
   run's own figure (metrics.json: rows trained / the training loop's seconds, which include each epoch's
   holdout evaluation and checkpoint). Full runs also train once with ZeRO 2 (``train_samples_per_s_zero2``).
5. Peak memory against ``plan-gpu``: an MLP of ~8.4 M parameters (three hidden layers of 2,048) trains one epoch
   on 3,000 rows with ZeRO 1 and with ZeRO 2. Each rank records how far its resident memory rose from just before
   the model was built to its peak while training (metrics.json ``memory``; the process's peak, which on these runs
   comes while training); the same figure for the demo's model of a few thousand parameters, trained the same way
   (same rows, epoch and stage), is torch's and DeepSpeed's own start-up, and is subtracted.
   ``memory_vs_plan_zero{1,2}`` is what remains over ``plan-gpu``'s fp32 per-GPU estimate for that shape, stage, 2
   processes and micro-batch (parameters, gradients, AdamW state, activations).

Machine: the 2-core box this runs on, shared with whatever else runs there (its load average at the start is
reported). The last line printed is one JSON object.

    python benchmarks/training.py [--quick]

``--quick`` (70 s on this box when idle, 3 minutes at a load average of 12): 5,000 joiner events, 100,000
synthetic records, the config's 4 epochs; the full run (3.5 minutes): 50,000 joiner events, 200,000 synthetic
records, 8 epochs, and the ZeRO 2 run. (With 60,000 records and 2 epochs the streaming model was under-trained and
lost to the one-input model: the comparison needs a few hundred optimizer steps.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feedback_loop.example_log import backfill_examples  # noqa: E402
from feedback_loop.snapshots import examples_frame, write_snapshot  # noqa: E402
from harness import private_stack, report  # noqa: E402  (this folder)
from infra.service import tail, wait_until  # noqa: E402
from loopline.components import feature_plan, project  # noqa: E402
from loopline.job_processes import start_joiner, stop_process_group  # noqa: E402
from loopline.project import world_of  # noqa: E402
from loopline.settings import Settings  # noqa: E402
from offline_training.ablation import train_arms  # noqa: E402
from offline_training.gpu_plan import ModelShape, training_memory  # noqa: E402
from offline_training.retraining import DEFAULT_TRAIN_CONFIG  # noqa: E402
from offline_training.train_config import TrainConfig, load_train_config  # noqa: E402
from schemas.kafka_config import consumer_settings, producer_settings  # noqa: E402
from schemas.project import Project  # noqa: E402
from schemas.records import PredictionRecord, TrainingExample  # noqa: E402
from schemas.topics import DAY_MS, PREDICTIONS, TRAINING_EXAMPLES, TopicSpec  # noqa: E402
from schemas.validation import decode, encode  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.topics import apply_topics, read_topic  # noqa: E402
from streams.world import Emitted  # noqa: E402

console = Console()
#: The synthetic world of the comparison (see tests/offline_training/test_ablation.py for why these knobs).
STREAM, STREAM_SEED = {"users": 2_000, "merchants": 500, "rate_per_s": 5.0}, 1
#: The inputs of the comparison (and of the joiner's predictions): a user's velocity, spend and novelty, and the amount
#: asked about, as every earlier run measured them (tests/offline_training/test_ablation.py's too).
BACKFILL_INPUTS = (
    *(
        f"user_transaction_features:{name}"
        for name in (
            "txn_count_5m",
            "txn_count_1h",
            "amount_sum_1h",
            "amount_max_24h",
            "distinct_merchants_1h",
            "distinct_countries_24h",
            "secs_since_prev_txn",
        )
    ),
    "request:amount",
)
REQUEST_INPUTS = [name for name in BACKFILL_INPUTS if name.startswith("request:")]
CHECKPOINT_INTERVAL_MS = 1_000
WARMUP_EVENTS = 500
START_TIMEOUT_S = 240.0
#: The memory comparison's model: wide enough (~8.4 M parameters) that its states, not torch's runtime, dominate.
MEMORY_HIDDEN, MEMORY_ROWS = (2048, 2048, 2048), 3_000
MEMORY_PARAMETERS = ModelShape.mlp((len(BACKFILL_INPUTS), *MEMORY_HIDDEN, 1)).parameters


class ExampleCounter:
    """Reads ``training.examples`` from its start as a read_committed consumer, keeping every value it saw."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = Consumer(consumer_settings(bootstrap, None, f"bench-{uuid.uuid4().hex[:8]}"))
        self.consumer.subscribe([TRAINING_EXAMPLES.name])
        self.values: list[bytes] = []

    def reached(self, count: int) -> bool:
        """Whether ``count`` examples are readable, after one more fetch."""
        self.values += [m.value() for m in self.consumer.consume(10_000, timeout=0.05) if m.error() is None]
        return len(self.values) >= count

    def close(self) -> None:
        self.consumer.close()


def _event_records(declared: Project, prefix: str, count: int) -> list[tuple[str, str, bytes]]:
    """(topic, key, value) of ``count`` scored events: each prediction (the comparison's inputs) followed by its label
    (on the project's label topic)."""
    now = int(time.time() * 1000)
    labels = declared.labels.topic
    label_type = declared.contract(labels).record_type
    records = []
    for i in range(count):
        event = f"{prefix}-{i}"
        features = {name: float(i % 97) for name in BACKFILL_INPUTS}
        prediction = PredictionRecord(
            schema_version=1,
            request_id=f"req-{event}",
            entity_keys={"user_id": f"u{i % 2_000:06d}"},
            features=features,
            model_name=declared.spec.model.name,
            model_version="1",
            score=0.1,
            requested_at_ms=now - 5,
            scored_at_ms=now,
            event_id=event,
        )
        label = label_type(
            schema_version=1,
            event_id=event,
            user_id=f"u{i % 2_000:06d}",
            is_fraud=i % 10 == 0,
            label_time_ms=now,
            source="chargeback" if i % 10 == 0 else "manual_review",
        )
        records += [
            (PREDICTIONS.name, prediction.request_id, encode(prediction)),
            (labels, event, declared.encode(labels, label)),
        ]
    return records


def _produce(producer: Producer, records: list[tuple[str, str, bytes]]) -> None:
    for topic, key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError("Kafka did not acknowledge every prediction and label")


def _backfill(settings: Settings, records: int):
    """The synthetic world's labelled transactions with their features recomputed point in time (snapshot columns)."""
    bootstrap, run, declared = settings.kafka.bootstrap, uuid.uuid4().hex[:6], project(settings)
    declared_topics = {spec.name: spec for spec in declared.topics}
    scored, labelled = declared_topics[declared.spec.scored_event.topic], declared_topics[declared.labels.topic]
    transactions = TopicSpec(f"bench.tx.{run}", scored.record_type, key=scored.key, partitions=2, retention_ms=7 * DAY_MS)
    labels = TopicSpec(f"bench.labels.{run}", labelled.record_type, key=labelled.key, partitions=1, retention_ms=7 * DAY_MS)
    apply_topics(bootstrap, [transactions, labels])
    # Yesterday's midnight (UTC): every window bucket falls where it does on any day, so the examples are the same.
    start_ms = (int(time.time() * 1000) // DAY_MS - 1) * DAY_MS
    routed = {scored.name: transactions.name, labelled.name: labels.name}
    stream = world_of(declared, STREAM_SEED, start_ms, **STREAM)
    EventProducer(bootstrap).publish(
        Emitted(routed[e.topic], e.key, e.value, e.emit_at_ms, e.record) for e in itertools.islice(stream, records)
    )
    plan = feature_plan(settings).reading({scored.name: transactions.name})
    return backfill_examples(
        plan,
        declared,
        {transactions.name: read_topic(bootstrap, transactions.name)},
        read_topic(bootstrap, labels.name),
        BACKFILL_INPUTS,
        scored_topic=transactions.name,
    )


def _demo_config(settings: Settings) -> TrainConfig:
    """The demo model's training config: the project's (``model.train_config``), else Loopline's default."""
    return load_train_config(settings.feedback.train_config or DEFAULT_TRAIN_CONFIG)


def _train_config(
    folder: Path, config: TrainConfig, epochs: int | None, ds_config: str | None = None, hidden: tuple[int, ...] | None = None
) -> Path:
    """The demo model's ``config``, with ``epochs`` (and ``ds_config``, ``hidden``) replaced, written to ``folder``."""
    changes = {
        "epochs": epochs or config.epochs,
        "ds_config": Path(ds_config or config.ds_config),
        "hidden": hidden or config.hidden,
    }
    path = folder / f"train-{changes['epochs']}-{changes['ds_config'].stem}-{'x'.join(map(str, changes['hidden']))}.yaml"
    path.write_text(json.dumps(config.model_copy(update=changes).model_dump(mode="json")))  # JSON is YAML
    return path


def _memory_against_plan(frame, work: Path, demo: TrainConfig, stage: int) -> dict:
    """Train the demo's model and the wide memory model, each one epoch on ``MEMORY_ROWS`` rows with ZeRO ``stage``;
    the most a rank's resident memory grew while training (metrics.json) for the wide one, less the same for the
    demo's (torch's and DeepSpeed's own start-up, like for like), against ``plan-gpu``'s fp32 estimate."""
    grown = {}
    for name, hidden in (("demo", None), ("wide", MEMORY_HIDDEN)):
        config = _train_config(work, demo, 1, f"infra/deepspeed/zero{stage}.json", hidden)
        arm = f"memory_{name}_zero{stage}"
        grown[name] = train_arms(frame.head(MEMORY_ROWS), {arm: BACKFILL_INPUTS}, work / arm, config)[arm].metrics
    metrics = grown["wide"]
    shape = ModelShape.mlp((len(BACKFILL_INPUTS), *MEMORY_HIDDEN, 1))
    if shape.parameters != metrics["parameters"]:
        raise SystemExit(f"plan-gpu counts {shape.parameters:,.0f} parameters, the trained model has {metrics['parameters']:,}")
    estimate = training_memory(
        shape, "fp32", stage, metrics["world_size"], load_train_config(config).micro_batch_per_process
    ).total
    fixed = grown["demo"]["memory"]["training_bytes"]
    measured = metrics["memory"]["training_bytes"] - fixed
    return {
        f"framework_memory_mb_zero{stage}": round(fixed / 1e6, 1),
        f"peak_memory_mb_zero{stage}": round(measured / 1e6, 1),
        f"plan_gpu_estimate_mb_zero{stage}": round(estimate / 1e6, 1),
        f"memory_vs_plan_zero{stage}": round(measured / estimate, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches, fewer epochs, no ZeRO 2 run")
    args = parser.parse_args()
    events, records, epochs = (5_000, 100_000, None) if args.quick else (50_000, 200_000, 8)
    figures: dict = {"load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="loopline-bench-training-"))

    with private_stack(console, "loopline-bench-training-") as settings:
        bootstrap, declared, demo = settings.kafka.bootstrap, project(settings), _demo_config(settings)
        producer = Producer(producer_settings(bootstrap, None, {"linger.ms": 5}))
        counter = ExampleCounter(bootstrap)
        log = work / "joiner.log"
        launched = time.monotonic()
        joiner = start_joiner(settings, log, LOOPLINE_FEEDBACK__CHECKPOINT_INTERVAL_MS=str(CHECKPOINT_INTERVAL_MS))
        try:
            _produce(producer, _event_records(declared, "warmup", WARMUP_EVENTS))
            # The job starts (unmeasured) while the comparison's examples are backfilled beside it.
            with console.status(f"backfilling {records:,} synthetic records while the joiner starts"):
                frame = _backfill(settings, records)
            with console.status("waiting for the joiner's first examples"):
                if not wait_until(lambda: counter.reached(WARMUP_EVENTS) or joiner.poll() is not None, START_TIMEOUT_S, 0.05) or (
                    joiner.poll() is not None
                ):
                    raise SystemExit(
                        f"the joiner did not start within {START_TIMEOUT_S:.0f} s; its log:\n" + "\n".join(tail(log, 30))
                    )
            figures["joiner_startup_s"] = round(time.monotonic() - launched, 1)
            batch = _event_records(declared, f"bench-{uuid.uuid4().hex[:6]}", events)
            with console.status(f"joining {events:,} events ({len(batch):,} records)"):
                started = time.monotonic()
                _produce(producer, batch)
                joined = wait_until(lambda: counter.reached(WARMUP_EVENTS + events) or joiner.poll() is not None, 300, 0.0)
                seconds = time.monotonic() - started
            if not joined or joiner.poll() is not None:
                raise SystemExit(f"{len(counter.values) - WARMUP_EVENTS:,} of {events:,} examples in 300 s; see {log}")
        finally:
            stop_process_group(joiner, signal.SIGTERM)
            counter.close()
            del producer  # before the stack goes: a live client keeps reconnecting to the stopped broker
        examples = [decode(TrainingExample, value) for value in counter.values]
        measured = {e.event_id for e in examples if e.event_id.startswith("bench-") and e.label is not None}
        figures |= {
            "joiner_events_per_s": round(len(batch) / seconds),
            "joiner_events": len(batch),
            "joiner_seconds": round(seconds, 2),
            "joiner_examples_missing_or_doubled": abs(events - len(measured))
            + (len(examples) - len({e.event_id for e in examples})),
        }

        with console.status(f"writing a snapshot of {len(examples):,} examples"):
            rows = examples_frame(examples)
            started = time.monotonic()
            manifest = write_snapshot(
                rows,
                str(work / "snapshots"),
                kind="feedback",
                source={"benchmark": True},
                time_range={"from_ms": None, "to_ms": None},
                label_kind=declared.labels.kind,
            )
            seconds = time.monotonic() - started
        figures |= {
            "snapshot_rows_per_s": round(manifest.rows / seconds),
            "snapshot_rows": manifest.rows,
            "snapshot_seconds": round(seconds, 3),
        }

    config = _train_config(work, demo, epochs)
    arms = {"streaming": BACKFILL_INPUTS, "no_streaming": REQUEST_INPUTS}
    with console.status(
        f"training twice (DeepSpeed ZeRO 1, 2 processes, {load_train_config(config).epochs} epochs) on {len(frame):,} rows"
    ):
        started = time.monotonic()
        results = train_arms(frame, arms, work / "ablation", config)
        training_wall = time.monotonic() - started
    streaming, no_streaming = results["streaming"], results["no_streaming"]
    if streaming.metrics["rows"] != no_streaming.metrics["rows"]:
        raise SystemExit(f"the two runs split differently: {streaming.metrics['rows']} vs {no_streaming.metrics['rows']}")
    figures |= {
        "train_samples_per_s": streaming.metrics["samples_per_second"],
        "train_zero_stage": 1,
        "train_processes": 2,
        "train_rows": streaming.metrics["rows"]["train"],
        "holdout_rows": streaming.metrics["rows"]["holdout"],
        "holdout_positives": int(
            frame.sort_values(["predicted_at_ms", "event_id"])["label"].tail(streaming.metrics["rows"]["holdout"]).sum()
        ),
        "epochs": streaming.metrics["epochs"],
        "synthetic_records": records,
        "two_trainings_wall_s": round(training_wall, 1),
        "holdout_auc_streaming": round(streaming.holdout("auc"), 4),
        "holdout_auc_no_streaming": round(no_streaming.holdout("auc"), 4),
        "auc_gain": round(streaming.holdout("auc") - no_streaming.holdout("auc"), 4),
        "auc_ratio": round(streaming.holdout("auc") / no_streaming.holdout("auc"), 3),
    }
    if not args.quick:
        zero2 = _train_config(work, demo, epochs, "infra/deepspeed/zero2.json")
        with console.status("training once more with ZeRO 2"):
            figures["train_samples_per_s_zero2"] = train_arms(frame, {"zero2": BACKFILL_INPUTS}, work / "zero2", zero2)[
                "zero2"
            ].metrics["samples_per_second"]

    with console.status(f"peak training memory of a {'x'.join(map(str, MEMORY_HIDDEN))} MLP against plan-gpu (ZeRO 1 and 2)"):
        for stage in (1, 2):
            figures |= _memory_against_plan(frame, work, demo, stage)

    quick = f"quick mode: {events:,} events" if args.quick else f"{events:,} events"
    anchors = {
        "joiner_events_per_s": f"{quick}, start-up excluded, ≤ 1 s commit delay included",
        "joiner_examples_missing_or_doubled": "goal 0 — "
        + ("met" if figures["joiner_examples_missing_or_doubled"] == 0 else "NOT met"),
        "joiner_startup_s": "launch → first examples readable, beside the backfill",
        "snapshot_rows_per_s": f"{'quick mode: ' if args.quick else ''}write_snapshot on the joined examples",
        "train_samples_per_s": "DeepSpeed ZeRO 1, 2 processes, CPU (gloo)",
        "auc_gain": "goal > 0 (streaming features worth it) — " + ("met" if figures["auc_gain"] > 0 else "NOT met"),
        "holdout_auc_no_streaming": f"request fields only: {', '.join(REQUEST_INPUTS)}",
        "holdout_auc_streaming": f"{len(BACKFILL_INPUTS) - len(REQUEST_INPUTS)} streaming features + the request fields",
        **{
            f"framework_memory_mb_zero{stage}": f"a rank's resident growth training the demo's "
            f"{streaming.metrics['parameters']:,}-"
            "parameter model the same way: torch's and DeepSpeed's own start-up"
            for stage in (1, 2)
        },
        **{
            f"memory_vs_plan_zero{stage}": f"(a rank's resident growth − the framework's) / plan-gpu's fp32 per-GPU estimate, "
            f"{MEMORY_PARAMETERS / 1e6:.1f} M parameters, 2 processes"
            for stage in (1, 2)
        },
    }
    report(console, "training side of the loop", args.quick, figures, anchors, began)


if __name__ == "__main__":
    main()
