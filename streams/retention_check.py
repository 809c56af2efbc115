"""Whether a rebuild of the feature job's windows can be complete: each topic still holds a window's worth of events.

A rebuild reads each topic from its oldest retained record. Where Kafka has deleted older records (retention), a
window longer than what is left would count only what remains, and the rebuilt generation would be served as if
complete. So a rebuild is refused, in one line naming the topic, the view, the times and the fixes, when a topic's
records were deleted after the start of the longest window a view reads from it (plus its slide: the oldest tile is
counted whole). What was deleted is known only by where it ends: the oldest retained record of each partition whose
log no longer starts at offset 0, or for such a partition left empty, the topic's ``retention.ms`` before now.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from schemas.kafka_config import admin_settings, consumer_settings
from streams.feature_plan import FeaturePlan, PlanError


class RetentionError(PlanError):
    """A rebuild would undercount a view's windows: its topic no longer retains a window's worth of events."""


def deleted_until_ms(
    bootstrap_servers: str, kafka_properties: Mapping[str, str], topic: str, timeout_s: float = 30.0
) -> int | None:
    """The newest time up to which ``topic`` may have lost records to retention (epoch ms), None when it lost none."""
    consumer = Consumer(
        consumer_settings(
            bootstrap_servers, kafka_properties, f"loopline-retention-{uuid.uuid4()}", {"log_level": 0}, read_committed=False
        )
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        deleted: int | None = None
        for number in sorted(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, number), timeout=timeout_s)
            if low <= 0:
                continue
            if high > low:
                consumer.assign([TopicPartition(topic, number, low)])
                record = consumer.poll(timeout_s)
                if record is None or record.error() is not None:
                    raise TimeoutError(f"could not read the oldest retained record of {topic}[{number}] within {timeout_s:.0f} s")
                until = record.timestamp()[1]
            else:
                until = int(time.time() * 1000) - _retention_ms(bootstrap_servers, kafka_properties, topic, timeout_s)
            deleted = until if deleted is None else max(deleted, until)
        return deleted
    finally:
        consumer.close()


def _retention_ms(bootstrap_servers: str, kafka_properties: Mapping[str, str], topic: str, timeout_s: float) -> int:
    admin = AdminClient(admin_settings(bootstrap_servers, kafka_properties, {"log_level": 0}))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    return max(0, int(configs["retention.ms"].value))


def check_retention(
    plan: FeaturePlan, bootstrap_servers: str, kafka_properties: Mapping[str, str], now_ms: int | None = None
) -> None:
    """Refuse (RetentionError, one line with the fixes) a rebuild of ``plan`` from topics that no longer retain the
    longest window (and its slide) of a view reading them."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    for topic in plan.topics:
        views = [view for view in plan.views if view.topic == topic]
        spans = [(a.window_ms + (a.slide_ms or 0), view.name) for view in views for a in view.aggregations if a.window_ms]
        if not spans:
            continue
        span_ms, view = max(spans)
        deleted = deleted_until_ms(bootstrap_servers, kafka_properties, topic)
        if deleted is not None and deleted > now_ms - span_ms:
            raise RetentionError(
                f"{topic} no longer holds events before {_iso(deleted)} (deleted by retention), but {view}'s longest "
                f"window needs them since {_iso(now_ms - span_ms)}: rebuilt, its windows would undercount — fix: restart "
                "over the previous plan's checkpoint (revert the change), or rebuild anyway with "
                "LOOPLINE_STREAM__ALLOW_PARTIAL_REBUILD=true (the windows fill as new events come), and raise the topic's "
                "retention.ms above the longest window"
            )


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")
