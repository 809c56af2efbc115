"""Wires the skew and consistency monitor (`loopline monitor`) to the settings' stack: the predictions topic, the
reference snapshot (the prod version's training snapshot, or the one the settings name), and the event log the
consistency replay recomputes from."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka.admin import AdminClient

from feedback_loop.consistency import FeatureConsistency, check_consistency, events_needed_since
from feedback_loop.monitor import Monitor, MonitorConfig, References
from feedback_loop.monitor_metrics import MonitorMetrics
from feedback_loop.snapshots import find_snapshot
from infra.errors import StackError
from loopline.components import feature_plan, model_release
from loopline.settings import Settings
from schemas.records import PredictionRecord
from schemas.topics import PREDICTIONS
from streams.event_log import EventLogWindow
from streams.feature_plan import FeaturePlan


def reference_snapshot(settings: Settings) -> References:
    """What skew is measured against: ``monitor.reference_snapshot``, or the training snapshot of the version the
    served model's ``prod`` alias names (its ``loopline.snapshot_id`` tag). StackError when there is neither."""
    from offline_training.candidate import SNAPSHOT_TAG
    from schemas.model_registry import PROD_ALIAS

    snapshot_id = settings.monitor.reference_snapshot
    if snapshot_id is None:
        name = settings.serving.model_name
        release = model_release(settings)
        version = release.aliases(name).get(PROD_ALIAS)
        if version is None:
            raise StackError(
                f"{name} has no prod version to take a reference from",
                "set monitor.reference_snapshot (LOOPLINE_MONITOR__REFERENCE_SNAPSHOT) to a snapshot id",
            )
        snapshot_id = release.client.get_model_version(name, version).tags.get(SNAPSHOT_TAG)
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
    from offline_training.candidate import SNAPSHOT_TAG

    name, release = settings.serving.model_name, model_release(settings)
    aliases = release.aliases(name)
    versions = sorted(release.client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))
    return {
        "name": name,
        "versions": [
            {
                "version": str(v.version),
                "aliases": sorted(alias for alias, version in aliases.items() if version == str(v.version)),
                "snapshot_id": v.tags.get(SNAPSHOT_TAG),
                "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(v.creation_timestamp / 1000)),
            }
            for v in versions[:20]
        ],
    }


def consistency_replay(
    settings: Settings, plan: FeaturePlan
) -> Callable[[list[PredictionRecord]], Mapping[str, FeatureConsistency]]:
    """The replay of a batch of sampled requests: the event log from as far back as the batch's windowed features
    reach (``events_needed_since``), judged as the job judges it (late events out), recomputed point in time and
    compared. Features with no window (time since the previous event, which can lie anywhere before) are not replayed:
    the log read would be unbounded. One incremental reader serves every call: each reads only what was published
    since the one before. The monitor calls it from one timer, which awaits each replay before the next."""
    kafka = settings.kafka
    logs = {topic: EventLogWindow(plan, topic, kafka.bootstrap, kafka.client_config) for topic in plan.topics}
    windowed = [f"{view.name}:{agg.name}" for view in plan.views for agg in view.aggregations if agg.window_ms]

    def replay(batch: list[PredictionRecord]) -> Mapping[str, FeatureConsistency]:
        since = events_needed_since(plan, batch, windowed)
        if since is None:
            return {}
        accepted = {topic: log.events(since)[0] for topic, log in logs.items()}
        return check_consistency(plan, accepted, batch, features=windowed) if any(len(e) for e in accepted.values()) else {}

    return replay


def _partitions(settings: Settings, topic: str) -> int:
    admin = AdminClient({**settings.kafka.client_config, "bootstrap.servers": settings.kafka.bootstrap})
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
