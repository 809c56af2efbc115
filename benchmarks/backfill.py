"""How fast `loopline snapshot backfill` adds a feature to a snapshot, on a private embedded stack (127.0.0.1 only).

A backlog of the synthetic stream's transactions is published, then one labeled example per transaction of a sample
of them, logged as the joiner logs them (``training.examples``) with the transaction's entities and time as the
request's. A snapshot is taken of the examples without the merchant view's ``merchant_amount_mean_1h``, and the
backfill adds it, each example's value as of its request's time, recomputed from the retained events. It measures

* ``backfill_examples_per_s``: the snapshot's examples / the backfill's time (reading the example log and the
  retained events, the recompute, writing the new snapshot);
* ``backfill_events_per_s``: the retained events it read and recomputed over / that time.

No anchor: Chronon's and Tecton's backfills run on Spark clusters. Machine: the 2-core box this runs on. The last line
printed is one JSON object with every figure.

    python benchmarks/backfill.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import private_stack, report  # noqa: E402  (this folder)
from loopline.components import feature_plan, world  # noqa: E402
from loopline.retraining import backfill_snapshot, create_snapshot  # noqa: E402
from schemas.records import TrainingExample  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.world import Emitted  # noqa: E402

#: The feature backfilled, and one the examples were logged with.
ADDED = "merchant_transaction_features:merchant_amount_mean_1h"
LOGGED = "merchant_transaction_features:merchant_txn_count_5m"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 events, 2,000 examples: about a minute")
    args = parser.parse_args()
    events, every = (20_000, 10) if args.quick else (200_000, 10)
    console, began = Console(), time.monotonic()
    with private_stack(console, "loopline-backfill-") as settings:
        topic, start_ms = feature_plan(settings).views[0].topic, int(time.time() * 1000) - 3_600_000
        backlog = []
        for emitted in world(settings, 500.0, seed=5, start_ms=start_ms, malformed_rate=0.0):
            if emitted.topic == topic and emitted.record is not None:
                backlog.append(emitted)
                if len(backlog) == events:
                    break
        now = int(time.time() * 1000)
        examples = []
        for i, emitted in enumerate(backlog[::every]):
            t, record = emitted.record.event_time_ms, emitted.record
            example = TrainingExample(
                schema_version=TrainingExample.SCHEMA_VERSION,
                event_id=record.event_id,
                request_id=f"r-{i}",
                entity_keys={"user_id": record.user_id, "merchant_id": record.merchant_id},
                features={LOGGED: 0.0},
                model_name="fraud",
                model_version="1",
                score=0.5,
                label=float(i % 7 == 0),
                requested_at_ms=t,
                predicted_at_ms=t + 2,
                label_time_ms=t + 5,
                joined_at_ms=now,
            )
            examples.append(
                Emitted(settings.feedback.examples_topic, example.event_id, example.model_dump_json().encode(), now, example)
            )
        with console.status(f"publishing {events:,} events and {len(examples):,} examples"):
            EventProducer(settings.kafka.bootstrap).publish([*backlog, *examples])
        taken = create_snapshot(settings, None, None)
        timed = time.monotonic()
        extended = backfill_snapshot(settings, taken.snapshot_id, [ADDED], console)
        took = time.monotonic() - timed
    figures = {
        "events": events,
        "examples": taken.rows,
        "backfill_s": round(took, 2),
        "backfill_examples_per_s": round(taken.rows / took),
        "backfill_events_per_s": round(extended.source["events"] / took),
    }
    report(console, "snapshot backfill of one feature", args.quick, figures, {}, began)


if __name__ == "__main__":
    main()
