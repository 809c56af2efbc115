"""The streaming feature job, compiled from a project's Feast stream feature views (a FeaturePlan).

    Kafka, every topic the views read (raw bytes + topic/partition/offset)
        ─► key by topic and partition ─► decode by the topic's contract, range, per-partition watermark [JVM]
           ──invalid, out of range, late──► events.dlq
        ─► per topic: its events ─► per view over it: key by the entity's join keys
           ─► sliding windows updated per event [JVM keyed state]
              ├──an event that would take a tile past an exact total──► events.dlq (overflow)
              ├─► an entity's newest row, with its windows' steps, at most once per ``online_interval_ms``
              │   [JVM timers] ─► batched, idempotent writes to Redis in Feast's layout [JVM, Jedis pipelines]
              └─► held for ``offline_flush_interval_ms`` [JVM keyed state] ─► parquet offline log [Python]

One job reads all the project's topics: one checkpoint holds every view's state with every topic's offsets, one
deployment runs them, and the decoder and the windows share the job's slots; a change to any view restarts them all
(they restore from the same checkpoint). Events are decoded in the JVM by their contract (``EventContract``: JSON or
Avro, as each topic is encoded), so Python runs only for the parquet log, on Arrow batches of rows (pandas UDFs); the
online writes go from the JVM, whose Redis layout Python takes from Feast once, when it builds the job
(``OnlineWriter.jvm_layout``). Kafka offsets and all state are checkpointed together, and every step, Python or JVM,
finishes its batch before a checkpoint completes, so every row before the checkpoint is written. A restarted job
resumes from the last checkpoint; the online store orders an entity's rows by its latest event time, then the events
absorbed (``feature_store/online_write.py``), so whatever order the replay interleaves the partitions in, the store
ends with the row of every event, never with one written before the failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
from pyflink.common import Types
from pyflink.datastream.data_stream import DataStream
from pyflink.java_gateway import get_gateway
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import ScalarFunction, udf

from feature_store.view_state import PENDING, PROGRESS, SERVING, WRITTEN, Generation, PlannedView, plan_generations, views_key
from feature_store.window_tiles import view_windows
from schemas.project import load_project
from streams.feature_plan import MAX_EVENT_TIME_MS, MAX_EXACT_VALUE, SCALE, FeaturePlan, SourcePlan, ViewPlan, registered_plan
from streams.flink_job import java_ints, run_job
from streams.flink_job import new_environment as flink_environment
from streams.flink_submit import JobArchives, flink_run_command
from streams.job_settings import JOB_NAME, JobSettings
from streams.kafka_tables import KafkaTables
from streams.retention_check import check_retention

#: SQL type -> DataStream type, for the columns the job carries.
_TYPES = {
    "BYTES": Types.PRIMITIVE_ARRAY(Types.BYTE()),
    "INT": Types.INT(),
    "BIGINT": Types.LONG(),
    "DOUBLE": Types.DOUBLE(),
    "STRING": Types.STRING(),
    "BOOLEAN": Types.BOOLEAN(),
}
#: How often the job publishes each view's progress (``ProgressSink``).
PROGRESS_INTERVAL_MS = 1_000
#: A rebuilt generation becomes the one readers serve once its progress is this close to the clock (or its topic is read
#: to its end): as current as the serving one, whose reads are flagged stale only past the scorer's ``stale_after_s``
#: (5 s by default).
SWITCH_WITHIN_MS = 5_000
#: The raw source's columns: each record as read, and where it was read.
_RAW = ("key", "value", "partition", "offset", "topic")
#: The Python types of the columns of the offline log's rows (Feast's value types).
_VALUE_SQL = {"INT64": "BIGINT", "DOUBLE": "DOUBLE", "STRING": "STRING", "BOOL": "BOOLEAN"}


#: What the event decoder appends to each event, after its contract's fields: where the log has it (``SlidingWindows``
#: keeps each partition's last absorbed offset; the online rows carry them).
EVENT_POSITION = {"_kafka_partition": "INT", "_kafka_offset": "BIGINT"}


def row_type(columns: dict[str, str]):
    """The DataStream type of rows of ``columns`` (name -> SQL type)."""
    return Types.ROW_NAMED(list(columns), [_TYPES[sql] for sql in columns.values()])


class AppendOffline(ScalarFunction):
    """Append a batch of one view's rows to its offline log as a parquet file: join keys, event_timestamp, features."""

    def __init__(self, view: ViewPlan, directory: Path) -> None:
        self.join_keys = view.entity_keys
        self.features = view.feature_names
        self.directory = directory

    def eval(self, *columns: pd.Series) -> pd.Series:
        keys, version_us, features = (
            columns[: len(self.join_keys)],
            columns[len(self.join_keys)],
            columns[len(self.join_keys) + 1 :],
        )
        frame = pd.DataFrame(
            {
                **dict(zip(self.join_keys, keys, strict=True)),
                # The row version is a timestamp in microseconds (see streams/jvm SlidingWindows): the entity's
                # latest event time, and a count of the events absorbed since it, strictly growing, so a
                # point-in-time read finds each row.
                "event_timestamp": pd.to_datetime(version_us, unit="us", utc=True),
                **dict(zip(self.features, features, strict=True)),
            }
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{os.getpid()}.parquet"
        # Written under a hidden name and renamed, so readers of the folder never see half a file.
        frame.to_parquet(self.directory / f".{name}", index=False)
        os.replace(self.directory / f".{name}", self.directory / name)
        return pd.Series([True] * len(version_us))


#: The columns of a view's rows ``SlidingWindows`` emits after the join keys and before the features (its javadoc).
_ROW_VERSION, _ROW_ORDER, _ABSORBED = "version_us", ("latest_ms", "events"), "absorbed"


def steps_columns(view: ViewPlan) -> tuple[str, ...]:
    """The columns of a view's online rows holding each window's steps (``feature_store/window_tiles.py``)."""
    return tuple(f"steps_{slide}_{window}" for slide, window in view_windows(view.aggregations))


def feature_columns(view: ViewPlan, online: bool = False) -> dict[str, str]:
    """A view's rows: its join keys, row version (µs, for the offline log), the latest event time (ms) and the number
    of events absorbed (the online store's order), in ``online`` rows the log positions absorbed and each window's
    steps, then each feature (of the type its function gives)."""
    features = {a.name: _VALUE_SQL[view.value_types[a.name]] for a in view.aggregations}
    online_only = {_ABSORBED: "STRING", **dict.fromkeys(steps_columns(view), "BYTES")} if online else {}
    return {
        **dict.fromkeys(view.entity_keys, "STRING"),
        **dict.fromkeys((_ROW_VERSION, *_ROW_ORDER), "BIGINT"),
        **online_only,
        **features,
    }


def _aggregation_spec(view: ViewPlan, positions: dict[str, int]) -> str:
    """The view's aggregations in the text form SlidingWindows takes (columns by position)."""
    return ";".join(
        f"{a.name},{a.function},{positions[a.column]},{a.window_ms or 0},{a.slide_ms or 0}" for a in view.aggregations
    )


def _startup(settings: JobSettings) -> dict[str, str]:
    """The Kafka source's start: the group's committed offsets, or to rebuild the oldest retained event or a publishing
    time."""
    if not settings.rebuild:
        return {"scan.startup.mode": "group-offsets"}
    if settings.start_from_ms is None:
        return {"scan.startup.mode": "earliest-offset"}
    return {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": str(settings.start_from_ms)}


def _quoted(names) -> str:
    return ", ".join(f"`{name}`" for name in names)


def decoder_spec(plan: FeaturePlan) -> str:
    """What the job's ``EventDecoder`` takes: the sources, the raw rows' layout and the engine's ranges, as JSON."""
    return json.dumps(
        {
            "consumer": JOB_NAME,
            "raw": {name: i for i, name in enumerate(_RAW)},
            "maxEventTimeMs": MAX_EVENT_TIME_MS,
            "maxExactValue": repr(MAX_EXACT_VALUE),
            "sources": json.loads(plan.jvm_sources()),
        }
    )


def state_horizon_ms(view: ViewPlan) -> int:
    """How long after an entity's latest event its state may still matter: its view's longest window, or where the
    view has a feature without a window (``last``, ``time_since_previous``: they look back the view's ttl) the longer
    of that and its ttl; -1 for such a view without a ttl, whose entities never leave the state."""
    windows = [a.window_ms or 0 for a in view.aggregations]
    if any(a.window_ms is None for a in view.aggregations):
        return max(view.ttl_ms, *windows) if view.ttl_ms else -1
    return max(windows)


def windowed_rows(events, source: SourcePlan, view: ViewPlan, identity: str, state_check_ms: int):
    """The rows of ``view`` (``feature_columns``) from the sliding windows of its entity (``SlidingWindows``) over
    ``events`` (a Java DataStream of its topic's events, the contract's fields in order): one per event (for the
    offline log), the rows for the online store, an entity's newest at each read mark (``ReadMarks``), with
    its windows' steps, and the dead letters (JSON) of events the windows refused (a tile's total past what a window
    sums exactly). The windows' operator is named for the plan's ``identity``: a checkpoint of another plan holds
    no state Flink would map to it."""
    from pyflink.datastream import OutputTag

    operators = get_gateway().jvm.dev.loopline.streams
    positions = {name: i for i, name in enumerate(source.contract.field_names)}
    online = OutputTag(f"online-{view.name}", row_type(feature_columns(view, online=True))).get_java_output_tag()
    refused = OutputTag(f"refused-{view.name}", Types.STRING()).get_java_output_tag()
    letters = json.dumps({"consumer": JOB_NAME, "topic": view.topic, "fields": list(source.contract.field_names)})
    windows = operators.SlidingWindows(
        _aggregation_spec(view, positions),
        positions[view.time_field],
        SCALE,
        view.ttl_ms,
        online,
        refused,
        letters,
        state_horizon_ms(view),
        source.out_of_orderness_ms,
        state_check_ms,
        len(view.entity_keys),
    )
    rows = (
        events.keyBy(operators.FieldKey(java_ints([positions[key] for key in view.entity_keys])))
        .process(windows, row_type(feature_columns(view)).get_java_type_info())
        .name(f"aggregate {view.name}")
        .uid(f"aggregate-{view.name}-{identity}")
    )
    return rows, rows.getSideOutput(online), rows.getSideOutput(refused)


# PyFlink's own Table/DataStream bridge calls APIs it deprecated itself; that is not the user's to fix.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pyflink\.")


def build_job(env, plan: FeaturePlan, settings: JobSettings) -> None:
    """Add the feature pipeline for ``plan`` to a PyFlink StreamExecutionEnvironment.

    The source starts where the consumer group committed (or a restored checkpoint says), or with
    ``settings.rebuild`` at the oldest retained event (or the first published at ``settings.start_from_ms``), to
    rebuild the window state from the log: refused (RetentionError) where a topic no longer retains a view's longest
    window, unless ``settings.allow_partial_rebuild`` (``streams/retention_check.py``).
    """
    if settings.rebuild and settings.start_from_ms is None and not settings.allow_partial_rebuild:
        check_retention(plan, settings.bootstrap_servers, settings.kafka_properties)
    t_env = StreamTableEnvironment.create(env)
    tables = KafkaTables(settings.bootstrap_servers, settings.group_id, settings.kafka_properties)
    fetch = {"properties.fetch.min.bytes": "65536", "properties.fetch.max.wait.ms": "20"}
    t_env.execute_sql(
        tables.raw_source(
            "raw_events", ";".join(plan.topics), {**fetch, **_startup(settings)}, ["`topic` STRING METADATA VIRTUAL"]
        )
    )
    t_env.execute_sql(tables.dead_letter_sink(settings.dead_letter_topic))
    t_env.execute_sql("CREATE TABLE written (done BOOLEAN) WITH ('connector' = 'blackhole')")

    operators = get_gateway().jvm.dev.loopline.streams
    raw = t_env.to_data_stream(t_env.sql_query(f"SELECT {_quoted(_RAW)} FROM raw_events"))._j_data_stream
    raw_type = raw.getType()
    raw = raw.transform("mark how far the records are read", raw_type, operators.ReadMarks(settings.online_interval_ms)).uid(
        "read-marks"
    )
    decoder = operators.EventDecoder(decoder_spec(plan))
    letters = (
        raw.keyBy(operators.FieldKey(java_ints([_RAW.index("topic"), _RAW.index("partition")])))
        .process(decoder, Types.STRING().get_java_type_info())
        .name("decode events by their contracts")
        .uid("decode-events")
    )
    statements = t_env.create_statement_set()
    refused = []

    from feature_store.online_write import OnlineWriter  # Feast: on the client that builds the job, not on its workers

    offline_dirs = _offline_dirs(plan, settings)
    writer = OnlineWriter(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=settings.redis_cluster
    )
    generations = view_generations(writer, plan)
    for index, view in enumerate(plan.views):
        view_row = row_type(feature_columns(view)).get_java_type_info()
        events = letters.getSideOutput(decoder.events(view.topic))
        identity = plan.rows_identity(view)
        rows, online_rows, overflowed = windowed_rows(events, plan.source(view.topic), view, identity, settings.state_check_ms)
        refused.append(DataStream(overflowed))
        if tuple(writer.layout.views[view.name].windows) != tuple(view_windows(view.aggregations)):  # the rows' steps, in order
            raise ValueError(f"{view.name}: the registry's windows are not the plan's; compile the plan from the same registry")
        layout = writer.jvm_layout(
            generations[view.name][0],
            view.feature_names,
            settings.max_batch_rows,
            replica_acks=settings.replica_acks,
            replica_ack_timeout_ms=settings.replica_ack_timeout_ms,
            marks=(views_key(writer.project), WRITTEN + generations[view.name][0].namespace + ":"),
        )
        online_rows.sinkTo(operators.OnlineRowSink(layout)).name(f"write {view.name} online").uid(f"write-online-{view.name}")
        held = (
            rows.keyBy(operators.FieldKey(java_ints([])))
            .process(operators.TimedBatches(settings.offline_flush_interval_ms, view_row), view_row)
            .name(f"hold {view.name} for the offline log")
            .uid(f"hold-offline-{view.name}-{identity}")
        )
        t_env.create_temporary_view(f"held_{index}", t_env.from_data_stream(DataStream(held)))
        t_env.create_temporary_function(
            f"append_offline_{index}",
            udf(AppendOffline(view, offline_dirs[view.name]), result_type=DataTypes.BOOLEAN(), func_type="pandas"),
        )
        columns = _quoted([*view.entity_keys, _ROW_VERSION, *view.feature_names])
        statements.add_insert_sql(f"INSERT INTO written SELECT append_offline_{index}({columns}) FROM held_{index}")
    t_env.create_temporary_view("refused_events", t_env.from_data_stream(DataStream(letters).union(*refused)))
    statements.add_insert_sql("INSERT INTO dead_letters SELECT * FROM refused_events")
    progress = progress_config(writer, plan, generations, settings)
    (
        letters.getSideOutput(decoder.progress())
        .sinkTo(operators.ProgressSink(progress))
        .setParallelism(1)
        .name("publish the views' progress")
        .uid("publish-progress")
    )
    statements.attach_as_datastream()


def view_generations(writer, plan: FeaturePlan) -> dict[str, tuple[Generation, bool]]:
    """The generation of each view's rows the job writes, and whether it is pending (``feature_store/view_state.py``)."""
    planned = [
        PlannedView(
            view.name, plan.rows_identity(view), writer.layout.views[view.name].stored_name, view.entity_keys, view.aggregations
        )
        for view in plan.views
    ]
    return plan_generations(writer.redis, writer.project, planned)


def progress_config(writer, plan: FeaturePlan, generations: dict[str, tuple[Generation, bool]], settings: JobSettings) -> str:
    """What the job's ``ProgressSink`` takes, as JSON: where to publish each view's progress, its pending generation
    to promote, and the Kafka cluster whose end offsets it compares with."""
    views = [
        {
            "view": view.name,
            "topic": view.topic,
            "progressField": PROGRESS + generation.namespace,
            "writtenField": WRITTEN + generation.namespace + ":",
            "pending": generation.to_json() if pending else None,
            "pendingField": PENDING + view.name,
            "servingField": SERVING + view.name,
        }
        for view in plan.views
        for generation, pending in [generations[view.name]]
    ]
    return json.dumps(
        {
            "connection": writer.jvm_connection(),
            "key": views_key(writer.project),
            "views": views,
            "bootstrapServers": settings.bootstrap_servers,
            "kafkaProperties": dict(settings.kafka_properties),
            "groupId": settings.group_id,
            "restored": not settings.rebuild,
            "intervalMs": PROGRESS_INTERVAL_MS,
            "switchWithinMs": SWITCH_WITHIN_MS,
        }
    )


def _offline_dirs(plan: FeaturePlan, settings: JobSettings) -> dict[str, Path]:
    """Where each view's rows are appended: ``<offline_dir>/<view>``, or the path its FileSource declares in the repo."""
    root, repo = settings.offline_dir, settings.repo_path
    return {
        view.name: root / view.name if root is not None else repo / (view.offline_path or f"data/offline/{view.name}")
        for view in plan.views
    }


def new_environment(settings: JobSettings, restore_from: str | None = None):
    """A StreamExecutionEnvironment configured for the job (``streams/flink_job.py``); with ``settings.metrics_port``
    its metrics (``late_events``, ``invalid_events``, ``feature_rows_written`` and Flink's own) at ``:<port>/metrics``."""
    return flink_environment(
        name=JOB_NAME,
        connector_jar=settings.connector_jar,
        operators_jar=settings.operators_jar,
        checkpoint_dir=settings.checkpoint_dir,
        checkpoint_interval_ms=settings.checkpoint_interval_ms,
        parallelism=settings.parallelism,
        metrics_port=settings.metrics_port,
        restore_from=restore_from,
        flush_interval_ms=settings.flush_interval_ms,
        max_batch_rows=settings.max_batch_rows,
        python_options=settings.python_options,
    )


def run_embedded(plan: FeaturePlan, settings: JobSettings, restore: bool = True) -> None:
    """Run the job on an embedded mini-cluster until it fails or the process is stopped.

    With ``restore`` it resumes from the newest retained checkpoint, when there is one of the same plan; without one
    (or without ``restore``), it rebuilds its state from the oldest retained event (or the first published at
    ``settings.start_from_ms``). JobStateError when the checkpoint cannot be restored (see
    ``streams/flink_job.run_job``).
    """

    def build(restore_from: str | None):
        env = new_environment(settings, restore_from)
        rebuild = restore_from is None
        build_job(
            env, plan, dataclasses.replace(settings, rebuild=rebuild, start_from_ms=settings.start_from_ms if rebuild else None)
        )
        return env

    run_job(
        build,
        JOB_NAME,
        settings.checkpoint_dir,
        restore,
        "loopline stream submit --no-restore",
        bootstrap_servers=settings.bootstrap_servers,
        kafka_properties=settings.kafka_properties,
        plan=plan.identities(),
    )


def submit_command(
    flink: Path, jobmanager: str, settings: JobSettings, archives: JobArchives, from_savepoint: str | None
) -> list[str]:
    """The ``flink run`` command that submits this job, detached, to the cluster at ``jobmanager`` (REST host:port) at
    ``settings.parallelism``, with its environment and code (``archives``), restored from ``from_savepoint`` if given."""
    return flink_run_command(
        flink,
        jobmanager,
        "streams.feature_job",
        [settings.to_json()],
        archives,
        parallelism=settings.parallelism,
        from_savepoint=from_savepoint,
    )


def _main(settings_json: str) -> None:
    """Entry point under ``flink run``: compile the plan from the project's Feast registry and submit the job to that
    cluster (restored from what ``flink run`` names, or rebuilding when ``settings.rebuild`` says so)."""
    settings = JobSettings.from_json(settings_json)
    plan = registered_plan(
        load_project(settings.project_path), settings.feast_registry_path, settings.redis_connection, settings.source_topics
    )
    env = new_environment(settings)
    build_job(env, plan, settings)
    env.execute(JOB_NAME)


if __name__ == "__main__":
    _main(sys.argv[1])
