"""Wires the skew and consistency monitor (`loopline monitor`, ``feedback_loop/monitor.py``) to the settings' stack: the
predictions topic, the reference snapshot (the prod version's training snapshot, or the one the settings name), and the
event log the consistency replay recomputes from (``feedback_loop/consistency_replay.py``); and the model versions the
dashboard lists."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka.admin import AdminClient

from feedback_loop.consistency import FeatureConsistency
from feedback_loop.consistency_replay import consistency_replay as replay_against_log
from feedback_loop.monitor import Monitor, MonitorConfig, References
from feedback_loop.monitor_metrics import MonitorMetrics
from feedback_loop.snapshots import find_snapshot
from infra.errors import StackError
from loopline.components import feature_plan, model_release
from loopline.settings import Settings
from schemas.kafka_config import admin_settings
from schemas.records import PredictionRecord
from schemas.topics import PREDICTIONS
from streams.feature_plan import FeaturePlan


def reference_snapshot(settings: Settings) -> References:
    """What skew is measured against: ``monitor.reference_snapshot``, or the training snapshot of the version the
    served model's ``prod`` alias names (``offline_training/model_lineage.py``). StackError when there is neither."""
    from offline_training.model_lineage import prod_training_snapshot

    snapshot_id = settings.monitor.reference_snapshot
    if snapshot_id is None:
        name = settings.serving.model_name
        version, snapshot_id = prod_training_snapshot(model_release(settings), name)
        if version is None:
            raise StackError(
                f"{name} has no prod version to take a reference from",
                "set monitor.reference_snapshot (LOOPLINE_MONITOR__REFERENCE_SNAPSHOT) to a snapshot id",
            )
        if snapshot_id is None:
            raise StackError(
                f"{name} v{version} (prod) was not trained on a snapshot: no reference to measure skew against",
                "set monitor.reference_snapshot to a snapshot of its inputs (loopline snapshot create --backfill)",
            )
    manifest, _ = find_snapshot(settings.snapshots_root, snapshot_id)
    return manifest.snapshot_id, manifest.reference


def wait_for_reference(settings: Settings, waiting: Callable[[StackError], None]) -> References:
    """The reference snapshot, once there is one: until prod names a version trained on a snapshot (or the settings name
    one), ``waiting`` is told why (each new reason once) and the registry is asked again every
    ``monitor.check_interval_s``. A monitor installed before the first model (a fresh Helm release) waits, up and
    scraped, instead of exiting."""
    reason = None
    while True:
        try:
            return reference_snapshot(settings)
        except StackError as err:
            if str(err) != reason:
                reason = str(err)
                waiting(err)
        time.sleep(settings.monitor.check_interval_s)


def model_versions(settings: Settings) -> dict:
    """The served model's registered versions, newest first: aliases, training snapshot, registration time."""
    from offline_training.model_lineage import model_versions as registered_versions

    return registered_versions(model_release(settings), settings.serving.model_name)


def consistency_replay(
    settings: Settings, plan: FeaturePlan
) -> Callable[[list[PredictionRecord]], Mapping[str, FeatureConsistency]]:
    """The monitor's replay of sampled requests against the settings' event log (``feedback_loop/consistency_replay.py``)."""
    return replay_against_log(plan, settings.kafka.bootstrap, settings.kafka.client_config)


def _partitions(settings: Settings, topic: str) -> int:
    admin = AdminClient(admin_settings(settings.kafka.bootstrap, settings.kafka.client_config))
    metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise StackError(f"topic {topic} does not exist", "loopline stack up creates it; or start the scorer first")
    return len(metadata.partitions)


def build_monitor(settings: Settings, metrics: MonitorMetrics) -> Monitor:
    """The monitor over the settings' stack."""
    options = settings.monitor
    config = MonitorConfig(
        bootstrap_servers=settings.kafka.bootstrap,
        predictions_topic=PREDICTIONS.name,
        partitions=_partitions(settings, PREDICTIONS.name),
        app_id=options.app_id,
        data_dir=(settings.home / "monitor").absolute(),
        window_ms=int(options.window_s * 1000),
        bucket_ms=int(options.bucket_s * 1000),
        check_interval_s=options.check_interval_s,
        min_rows=options.min_rows,
        thresholds=options.thresholds.thresholds(),
        feature_thresholds={name: limits.thresholds() for name, limits in options.feature_thresholds.items()},
        sample_rate=options.sample_rate,
        consistency_interval_s=options.consistency_interval_s,
        settle_ms=int(options.settle_s * 1000),
        max_sampled=options.max_sampled,
        from_earliest=options.from_earliest,
    )
    return Monitor(config, lambda: reference_snapshot(settings), consistency_replay(settings, feature_plan(settings)), metrics)
