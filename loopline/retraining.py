"""The retraining path wired from settings: examples → snapshot → training (what `loopline snapshot create` and
`loopline train` run)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from feedback_loop.example_log import backfill_examples, logged_examples
from feedback_loop.snapshots import Manifest, examples_frame, find_snapshot, write_snapshot
from loopline.components import feature_plan
from loopline.settings import Settings
from schemas.topics import LABELS, TRAINING_EXAMPLES, TRANSACTIONS
from streams.topics import read_topic

#: The model's inputs when a snapshot is backfilled (no logged prediction names them): the demo model's.
BACKFILL_INPUTS = (
    "user_transaction_features:txn_count_5m", "user_transaction_features:txn_count_1h", "user_transaction_features:amount_sum_1h",
    "user_transaction_features:amount_max_24h", "user_transaction_features:distinct_merchants_1h",
    "user_transaction_features:distinct_countries_24h", "user_transaction_features:secs_since_prev_txn", "request:amount",
)  # fmt: skip
DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "offline_training" / "configs" / "fraud_mlp.yaml"


def create_snapshot(settings: Settings, from_ms: int | None, to_ms: int | None, backfill: bool = False) -> Manifest:
    """Snapshot the examples scored in ``[from_ms, to_ms)``: the joiner's (``training.examples``), or with ``backfill``
    examples recomputed point in time from the event log for every labeled transaction."""
    kafka = settings.kafka
    if backfill:
        transactions = read_topic(kafka.bootstrap_servers, TRANSACTIONS.name, kafka.client_config)
        labels = read_topic(kafka.bootstrap_servers, LABELS.name, kafka.client_config)
        frame = backfill_examples(feature_plan(settings), transactions, labels, BACKFILL_INPUTS)
        if from_ms is not None:
            frame = frame[frame["predicted_at_ms"] >= from_ms]
        if to_ms is not None:
            frame = frame[frame["predicted_at_ms"] < to_ms]
        source = {"backfill": {"transactions": TRANSACTIONS.name, "labels": LABELS.name, "events": len(transactions)}}
    else:
        examples, source = logged_examples(kafka.bootstrap_servers, TRAINING_EXAMPLES.name, from_ms, to_ms, kafka.client_config)
        frame = examples_frame(examples)
    return write_snapshot(frame, settings.snapshots_root, kind="backfill" if backfill else "feedback", source=source,
                          time_range={"from_ms": from_ms, "to_ms": to_ms})  # fmt: skip


def train_on_snapshot(settings: Settings, snapshot_id: str, resume: bool = False, processes: int | None = None) -> Path:
    """Train on a snapshot (DeepSpeed under torchrun), the run's folder ``<home>/training/<snapshot id>``; the path of
    its metrics (holdout AUC, log loss, Brier, samples/s). Without ``resume`` an earlier run's folder is replaced."""
    from offline_training.launch import launch_training

    manifest, folder = find_snapshot(settings.snapshots_root, snapshot_id)
    out = (settings.home / "training" / manifest.snapshot_id).absolute()
    if not resume and out.exists():
        shutil.rmtree(out)
    launch_training(
        Path(folder), settings.feedback.train_config or DEFAULT_TRAIN_CONFIG, out, processes or settings.feedback.train_processes,
        resume=resume, tracking_uri=settings.tracking_uri, echo=sys.stderr,
    )  # fmt: skip
    return out / "metrics.json"
