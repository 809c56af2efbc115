"""The streaming feature job, compiled from the Feast stream feature views (a FeaturePlan).

    Kafka (raw bytes + partition/offset) ─► decode & validate ──invalid──► events.dlq
        ─► per-partition watermark (bounded out-of-orderness) ─► drop late ──late──► events.dlq
        ─► per view: key by entity ─► sliding windows updated per event (keyed state)
        ─► batched, idempotent writes to the online store through Feast (+ offline parquet log)

Kafka offsets and all window state are checkpointed together; a restarted job resumes from
the last checkpoint and recomputes identical rows for replayed events, which the online store
skips as not newer. Rows buffered for writing live in keyed state too, so none is lost.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyflink.common import Types
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import KeyedProcessFunction, OutputTag
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema, KafkaSink
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor
from pyflink.table import StreamTableEnvironment

from schemas.records import DeadLetterRecord, TransactionEvent
from schemas.validation import ContractViolation, decode, encode
from streams.feature_plan import FeaturePlan, ViewPlan
from streams.job_settings import JOB_NAME, JobSettings
from streams.window_state import EntityWindows

DEAD_LETTER_TAG_NAME = "dead-letters"


def _dead_letter(reason: str, error: str, error_field: str | None, raw: dict) -> str:
    return encode(
        DeadLetterRecord.for_payload(
            reason=reason,
            error=error,
            error_field=error_field,
            source_topic=raw["topic"],
            source_partition=raw["partition"],
            source_offset=raw["offset"],
            key=raw["key"],
            payload=raw["value"],
            consumer=JOB_NAME,
        )
    ).decode()


DEAD_LETTERS_TAG = OutputTag(DEAD_LETTER_TAG_NAME, Types.STRING())


class DecodeOnTimeEvents(KeyedProcessFunction):
    """Validate each record against its contract and drop late ones; both become dead letters.

    Keyed by Kafka partition. Lateness is judged against the partition's own watermark: the
    newest event time seen in that partition minus the allowed out-of-orderness (the per-split
    watermark Flink's Kafka source keeps before merging partitions). Unlike the merged watermark,
    it does not depend on how fast the other partitions happen to be read, so a replay reaches
    the same verdicts. Late events are counted in ``late_events``.
    """

    def __init__(self, topic: str, out_of_orderness_ms: int) -> None:
        self.topic = topic
        self.out_of_orderness_ms = out_of_orderness_ms

    def open(self, runtime_context):
        self.newest = runtime_context.get_state(ValueStateDescriptor("newest_event_time", Types.LONG()))
        self.late = runtime_context.get_metrics_group().counter("late_events")
        self.invalid = runtime_context.get_metrics_group().counter("invalid_events")

    def process_element(self, row, ctx):
        raw = {"topic": self.topic, "partition": row[2], "offset": row[3], "key": row[0], "value": row[1]}
        try:
            event = decode(TransactionEvent, raw["value"] or b"")
        except ContractViolation as violation:
            self.invalid.inc()
            yield DEAD_LETTERS_TAG, _dead_letter("invalid", str(violation), violation.field, raw)
            return
        newest = self.newest.value()
        watermark = None if newest is None else newest - self.out_of_orderness_ms
        if watermark is not None and event.event_time_ms < watermark:
            self.late.inc()
            behind = watermark - event.event_time_ms
            yield DEAD_LETTERS_TAG, _dead_letter(
                "late", f"event time is {behind} ms behind the partition's watermark", "event_time_ms", raw
            )
            return
        if newest is None or event.event_time_ms > newest:
            self.newest.update(event.event_time_ms)
        yield event.model_dump()


class AggregateView(KeyedProcessFunction):
    """One view's sliding windows for one entity, updated per event."""

    def __init__(self, view: ViewPlan) -> None:
        self.view = view

    def open(self, runtime_context):
        self.windows = runtime_context.get_state(ValueStateDescriptor("windows", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, event, ctx):
        windows = self.windows.value() or EntityWindows()
        windows.absorb(self.view, event)
        self.windows.update(windows)
        yield self.view.name, event[self.view.entity_key], windows.version_us, windows.features(self.view)


class WriteFeatures(KeyedProcessFunction):
    """Buffers rows in keyed state and writes them in batches on a short timer (or when full)."""

    def __init__(self, settings: JobSettings, join_keys: dict[str, str], offline_dirs: dict[str, Path]) -> None:
        self.settings = settings
        self.join_keys = join_keys
        self.offline_dirs = offline_dirs

    def open(self, runtime_context):
        from feature_store.online_write import OnlineWriter

        pickled = Types.PICKLED_BYTE_ARRAY()
        self.writer = OnlineWriter(self.settings.registry_path, self.settings.redis_address)
        self.pending = runtime_context.get_list_state(ListStateDescriptor("pending", pickled))
        self.pending_count = runtime_context.get_state(ValueStateDescriptor("pending_count", Types.LONG()))
        self.flush_due = runtime_context.get_state(ValueStateDescriptor("flush_due", Types.LONG()))
        self.offline = runtime_context.get_list_state(ListStateDescriptor("offline", pickled))
        self.offline_since = runtime_context.get_state(ValueStateDescriptor("offline_since", Types.LONG()))
        self.rows_written = runtime_context.get_metrics_group().counter("feature_rows_written")

    def process_element(self, row, ctx):
        self.pending.add(row)
        count = (self.pending_count.value() or 0) + 1
        self.pending_count.update(count)
        now = ctx.timer_service().current_processing_time()
        due = self.flush_due.value()
        # No flush scheduled, or the one scheduled before a restore is overdue: schedule one. A spare
        # timer is harmless (flushing nothing is a no-op); a missing one would strand the rows.
        if due is None or due < now:
            self.flush_due.update(now + self.settings.flush_interval_ms)
            ctx.timer_service().register_processing_time_timer(now + self.settings.flush_interval_ms)
        if count >= self.settings.max_batch_rows:
            self._flush(now)
        return ()  # a sink: nothing flows on

    def on_timer(self, timestamp, ctx):
        self.flush_due.clear()
        self._flush(timestamp)
        return ()

    def _flush(self, now_ms: int) -> None:
        from feature_store.online_write import FeatureRow

        rows = [FeatureRow(*row) for row in self.pending.get()]
        self.pending.clear()
        self.pending_count.clear()
        if not rows:
            return
        self.rows_written.inc(self.writer.write(rows))
        self.offline.add_all(rows)
        since = self.offline_since.value()
        if since is None:
            self.offline_since.update(now_ms)
        elif now_ms - since >= self.settings.offline_flush_interval_ms:
            _append_offline(list(self.offline.get()), self.join_keys, self.offline_dirs)
            self.offline.clear()
            self.offline_since.clear()


def build_job(env, plan: FeaturePlan, settings: JobSettings) -> None:
    """Add the feature pipeline for ``plan`` to a PyFlink StreamExecutionEnvironment."""
    pickled = Types.PICKLED_BYTE_ARRAY()
    t_env = StreamTableEnvironment.create(env)
    # The value stays raw bytes, so a bad record is dead-lettered exactly as it came.
    t_env.execute_sql(
        f"""
        CREATE TABLE raw_events (
          `key` BYTES,
          `value` BYTES,
          `partition` INT METADATA VIRTUAL,
          `offset` BIGINT METADATA VIRTUAL
        ) WITH (
          'connector' = 'kafka',
          'topic' = '{plan.topic}',
          'properties.bootstrap.servers' = '{settings.bootstrap_servers}',
          'properties.group.id' = '{settings.group_id}',
          'properties.auto.offset.reset' = 'earliest',
          'scan.startup.mode' = 'group-offsets',
          'key.format' = 'raw',
          'key.fields' = 'key',
          'value.format' = 'raw',
          'value.fields-include' = 'EXCEPT_KEY'
        )"""
    )
    on_time = (
        t_env.to_data_stream(t_env.from_path("raw_events"))
        .key_by(lambda row: row[2], key_type=Types.INT())
        .process(DecodeOnTimeEvents(plan.topic, plan.out_of_orderness_ms), output_type=pickled)
        .name("decode, validate, drop late")
    )
    rows = None
    for view in plan.views:
        view_rows = (
            on_time.key_by(lambda event, key=view.entity_key: event[key], key_type=Types.STRING())
            .process(AggregateView(view), output_type=pickled)
            .name(f"aggregate {view.name}")
        )
        rows = view_rows if rows is None else rows.union(view_rows)
    assert rows is not None
    writer = WriteFeatures(
        settings, {view.name: view.entity_key for view in plan.views}, _offline_dirs(plan, settings.offline_dir)
    )
    rows.key_by(lambda row: row[0], key_type=Types.STRING()).process(writer).name("write online + offline")

    on_time.get_side_output(DEAD_LETTERS_TAG).sink_to(
        KafkaSink.builder()
        .set_bootstrap_servers(settings.bootstrap_servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(settings.dead_letter_topic)
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE)
        .build()
    ).name("dead letters")


def _offline_dirs(plan: FeaturePlan, root: Path | None) -> dict[str, Path]:
    """Where each view's rows are appended: ``<root>/<view>``, or the path its FileSource declares in the repo."""
    from feature_store.config import REPO_PATH

    return {
        view.name: root / view.name if root is not None else REPO_PATH / (view.offline_path or f"data/offline/{view.name}")
        for view in plan.views
    }


def _append_offline(rows, join_keys: dict[str, str], offline_dirs: dict[str, Path]) -> None:
    """Append feature rows as one parquet file per view: join key, event_timestamp (the row version), features."""
    import pandas as pd

    by_view: dict[str, list] = {}
    for row in rows:
        by_view.setdefault(row.view, []).append(row)
    for view, view_rows in by_view.items():
        frame = pd.DataFrame(
            [{join_keys[view]: r.entity, "event_timestamp": r.timestamp, **r.features} for r in view_rows]
        )
        target = offline_dirs[view]
        target.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(target / f"part-{time.time_ns()}-{os.getpid()}.parquet", index=False)


def new_environment(settings: JobSettings, restore_from: str | None = None):
    """A StreamExecutionEnvironment configured for the job: connector jar, checkpoints, Python bundles."""
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment

    config = Configuration()
    config.set_string("pipeline.jars", settings.connector_jar.as_uri())
    config.set_string("pipeline.name", JOB_NAME)
    # Small bundles and buffers: freshness matters more than the last bit of throughput.
    config.set_string("python.fn-execution.bundle.time", "20")
    config.set_string("python.fn-execution.bundle.size", "500")
    config.set_string("execution.buffer-timeout.interval", "10 ms")
    # Window state of every active entity stays in the Python worker's cache, not behind a round trip.
    config.set_string("python.state.cache-size", "100000")
    for key, value in settings.python_options.items():
        config.set_string(key, value)
    config.set_string("execution.checkpointing.storage", "filesystem")
    config.set_string("execution.checkpointing.dir", settings.checkpoint_dir.absolute().as_uri())
    config.set_string("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION")
    if restore_from:
        config.set_string("execution.state-recovery.path", restore_from)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(settings.parallelism)
    env.enable_checkpointing(settings.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    return env


def run_embedded(plan: FeaturePlan, settings: JobSettings, restore: bool = True) -> None:
    """Run the job on an embedded mini-cluster until it fails or the process is stopped.

    With ``restore`` it resumes from the newest retained checkpoint, when there is one.
    """
    restore_from = latest_checkpoint(settings.checkpoint_dir) if restore else None
    env = new_environment(settings, restore_from)
    build_job(env, plan, settings)
    env.execute(JOB_NAME)


def submit_command(flink: Path, jobmanager: str, settings: JobSettings, source_topic: str | None) -> list[str]:
    """The ``flink run`` command that submits this job, detached, to the cluster at ``jobmanager`` (REST host:port)."""
    restore_from = latest_checkpoint(settings.checkpoint_dir)
    return [
        str(flink), "run", "--detached", "--jobmanager", jobmanager,
        *(["--fromSavepoint", restore_from] if restore_from else []),
        "--python", __file__, "--pyExecutable", sys.executable, "--pyClientExecutable", sys.executable,
        settings.to_json(), source_topic or "",
    ]  # fmt: skip


def _main(settings_json: str, source_topic: str) -> None:
    """Entry point under ``flink run``: compile the plan from the registry and submit the job to that cluster."""
    from feature_store.config import feature_store
    from streams.feature_plan import compile_plan

    settings = JobSettings.from_json(settings_json)
    plan = compile_plan(feature_store(settings.registry_path, settings.redis_address).list_stream_feature_views())
    env = new_environment(settings)
    build_job(env, plan.reading(source_topic) if source_topic else plan, settings)
    env.execute(JOB_NAME)


def latest_checkpoint(checkpoint_dir: Path) -> str | None:
    """The newest completed checkpoint under ``checkpoint_dir`` (a ``chk-N`` folder with metadata)."""
    completed = [p for p in checkpoint_dir.glob("*/chk-*") if (p / "_metadata").exists()]
    if not completed:
        return None
    return str(max(completed, key=lambda p: (p.stat().st_mtime, int(p.name.split("-")[1]))))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
