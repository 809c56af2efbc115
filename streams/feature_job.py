"""The streaming feature job, compiled from the Feast stream feature views (a FeaturePlan).

    Kafka (raw bytes + partition/offset) ─► decode & validate [Python, Arrow batches] ──invalid──► events.dlq
        ─► per-partition watermark (bounded out-of-orderness) [JVM] ──late──► events.dlq
        ─► per view: key by entity ─► sliding windows updated per event [JVM keyed state]
           ├─► an entity's newest row, with its windows' steps, at most once per ``online_interval_ms``
           │   [JVM timers] ─► batched, idempotent writes to Redis in Feast's layout [JVM, Jedis pipelines]
           └─► held for ``offline_flush_interval_ms`` [JVM keyed state] ─► parquet offline log [Python]

Python runs only where the contracts are needed (decoding, dead letters) and for the parquet log, on Arrow batches
of rows (pandas UDFs); the per-event state work and the online writes run in the JVM operators of ``streams/jvm``
(see ``streams/operators_jar.py``), whose Redis layout Python takes from Feast once, when it builds the job
(``OnlineWriter.jvm_layout``). Kafka offsets and all state are checkpointed together, and every step, Python or
JVM, finishes its batch before a checkpoint completes, so every row before the checkpoint is written. A restarted job resumes from
the last checkpoint; the online store orders an entity's rows by its latest event time, then the
events absorbed (``feature_store/online_write.py``), so whatever order the replay interleaves the
partitions in, the store ends with the row of every event, never with one written before the failure.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
from pyflink.common import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.data_stream import DataStream
from pyflink.java_gateway import get_gateway
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from feature_store.window_tiles import view_windows
from schemas.ddl import column_types
from schemas.records import TransactionEvent
from streams.feature_plan import SCALE, FeaturePlan, ViewPlan, registered_plan
from streams.flink_job import new_environment as flink_environment
from streams.flink_job import run_job
from streams.flink_submit import JobArchives, flink_run_command
from streams.job_settings import JOB_NAME, JobSettings
from streams.kafka_tables import RAW_COLUMNS, KafkaTables, dead_letter, decode_or_dead_letter

#: SQL type -> (DataStream type, Table type) for the columns the job carries.
_TYPES = {
    "BYTES": (Types.PRIMITIVE_ARRAY(Types.BYTE()), DataTypes.BYTES()),
    "INT": (Types.INT(), DataTypes.INT()),
    "BIGINT": (Types.LONG(), DataTypes.BIGINT()),
    "DOUBLE": (Types.DOUBLE(), DataTypes.DOUBLE()),
    "STRING": (Types.STRING(), DataTypes.STRING()),
    "BOOLEAN": (Types.BOOLEAN(), DataTypes.BOOLEAN()),
}
_EVENT_COLUMNS = column_types(TransactionEvent)
#: A decoded row: the Kafka record as read, its dead letter when invalid, and the event's fields.
_DECODED_COLUMNS = {**RAW_COLUMNS, "dead_letter": "STRING", **_EVENT_COLUMNS}
_EVENT_TIME = "event_time_ms"


def row_type(columns: dict[str, str]):
    """The DataStream type of rows of ``columns`` (name -> SQL type)."""
    return Types.ROW_NAMED(list(columns), [_TYPES[sql][0] for sql in columns.values()])


class DecodeEvents(ScalarFunction):
    """Validate a batch of records against their contract and the engine's range: the event's fields, or a
    dead letter saying why not (``invalid``, ``out_of_range``, or ``unprocessable`` for anything else)."""

    def __init__(self, plan: FeaturePlan) -> None:
        self.plan = plan

    def open(self, function_context: FunctionContext) -> None:
        self.invalid = function_context.get_metric_group().counter("invalid_events")

    def _event(self, key, value, partition, offset) -> dict:
        topic = self.plan.topic
        record, letter = decode_or_dead_letter(TransactionEvent, JOB_NAME, topic, partition, offset, key, value)
        if record is None:
            return {"dead_letter": letter}
        event = record.model_dump()
        problem = self.plan.out_of_range(event)
        if problem is not None:
            return {"dead_letter": dead_letter(JOB_NAME, "out_of_range", f"{problem[0]}: {problem[1]}", problem[0], topic, partition,
                                               offset, key, value)}  # fmt: skip
        return event

    def eval(self, key: pd.Series, value: pd.Series, partition: pd.Series, offset: pd.Series) -> pd.DataFrame:
        columns: dict[str, list] = {name: [] for name in ("dead_letter", *_EVENT_COLUMNS)}
        for k, v, p, o in zip(key, value, partition, offset, strict=True):
            event = self._event(k, v, p, o)
            if event.get("dead_letter") is not None:
                self.invalid.inc()
            for name, values in columns.items():
                values.append(event.get(name))
        return pd.DataFrame({name: pd.Series(values, dtype=object) for name, values in columns.items()})


class LateDeadLetters(ScalarFunction):
    """The dead letters of a batch of late events."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def eval(self, key, value, partition, offset, behind_ms) -> pd.Series:
        return pd.Series(
            [
                dead_letter(JOB_NAME, "late", f"event time is {b} ms behind the partition's watermark", _EVENT_TIME, self.topic, p, o, k, v)
                for k, v, p, o, b in zip(key, value, partition, offset, behind_ms, strict=True)
            ]
        )


class AppendOffline(ScalarFunction):
    """Append a batch of one view's rows to its offline log as a parquet file: join key, event_timestamp, features."""

    def __init__(self, view: ViewPlan, directory: Path) -> None:
        self.join_key = view.entity_key
        self.features = view.feature_names
        self.directory = directory

    def eval(self, entity: pd.Series, version_us: pd.Series, *features: pd.Series) -> pd.Series:
        frame = pd.DataFrame(
            {
                self.join_key: entity,
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
        return pd.Series([True] * len(entity))


#: The columns of a view's rows ``SlidingWindows`` emits before the features (see its javadoc).
_ROW_VERSION, _ROW_ORDER = "version_us", ("latest_ms", "events")


def steps_columns(view: ViewPlan) -> tuple[str, ...]:
    """The columns of a view's online rows holding each window's steps (``feature_store/window_tiles.py``)."""
    return tuple(f"steps_{slide}_{window}" for slide, window in view_windows(view.aggregations))


def feature_columns(view: ViewPlan, online: bool = False) -> dict[str, str]:
    """A view's rows: entity, row version (µs, for the offline log), the latest event time (ms) and the number of
    events absorbed (the online store's order), in ``online`` rows each window's steps, then each feature (counts are
    integers)."""
    integral = {"count", "count_distinct"}
    features = {a.name: "BIGINT" if a.function in integral else "DOUBLE" for a in view.aggregations}
    steps = dict.fromkeys(steps_columns(view), "BYTES") if online else {}
    return {view.entity_key: "STRING", **dict.fromkeys((_ROW_VERSION, *_ROW_ORDER), "BIGINT"), **steps, **features}


def _aggregation_spec(view: ViewPlan, positions: dict[str, int]) -> str:
    """The view's aggregations in the text form SlidingWindows takes (columns by position)."""
    return ";".join(
        f"{a.name},{a.function},{positions[a.column]},{a.window_ms or 0},{a.slide_ms or 0}" for a in view.aggregations
    )


def _startup(settings: JobSettings, from_earliest: bool) -> dict[str, str]:
    """The Kafka source's start: the group's committed offsets, the oldest retained event, or a publishing time."""
    if not from_earliest:
        return {"scan.startup.mode": "group-offsets"}
    if settings.start_from_ms is None:
        return {"scan.startup.mode": "earliest-offset"}
    return {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": str(settings.start_from_ms)}


def _quoted(names) -> str:
    return ", ".join(f"`{name}`" for name in names)


def windowed_rows(events, view: ViewPlan, positions: dict[str, int], online_interval_ms: int):
    """The rows of ``view`` (``feature_columns``) from the sliding windows of its entity (``SlidingWindows``) over
    ``events`` (a Java DataStream of rows holding each event column at its index in ``positions``): one per event
    (for the offline log), and the rows for the online store, an entity's newest at most once per
    ``online_interval_ms``, with its windows' steps."""
    operators = get_gateway().jvm.dev.loopline.streams
    online = OutputTag(f"online-{view.name}", row_type(feature_columns(view, online=True))).get_java_output_tag()
    windows = operators.SlidingWindows(_aggregation_spec(view, positions), positions[_EVENT_TIME], SCALE, online, online_interval_ms)
    rows = (
        events.keyBy(operators.FieldKey(positions[view.entity_key]))
        .process(windows, row_type(feature_columns(view)).get_java_type_info())
        .name(f"aggregate {view.name}")
        .uid(f"aggregate-{view.name}")
    )
    return rows, rows.getSideOutput(online)


# PyFlink's own Table/DataStream bridge calls APIs it deprecated itself; that is not the user's to fix.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pyflink\.")


def build_job(env, plan: FeaturePlan, settings: JobSettings, from_earliest: bool = False) -> None:
    """Add the feature pipeline for ``plan`` to a PyFlink StreamExecutionEnvironment.

    The source starts where the consumer group committed (or a restored checkpoint says), or with
    ``from_earliest`` at the oldest retained event (or the first published at ``settings.start_from_ms``), to
    rebuild the window state from the log.
    """
    t_env = StreamTableEnvironment.create(env)
    tables = KafkaTables(settings.bootstrap_servers, settings.group_id, settings.kafka_properties)
    fetch = {"properties.fetch.min.bytes": "65536", "properties.fetch.max.wait.ms": "20"}
    t_env.execute_sql(tables.raw_source("raw_events", plan.topic, {**fetch, **_startup(settings, from_earliest)}))
    t_env.execute_sql(tables.dead_letter_sink(settings.dead_letter_topic))
    t_env.execute_sql("CREATE TABLE written (done BOOLEAN) WITH ('connector' = 'blackhole')")

    decoded_row = DataTypes.ROW(
        [DataTypes.FIELD(name, _TYPES[sql][1]) for name, sql in {"dead_letter": "STRING", **_EVENT_COLUMNS}.items()]
    )
    t_env.create_temporary_function("decode_event", udf(DecodeEvents(plan), result_type=decoded_row, func_type="pandas"))
    t_env.create_temporary_function(
        "late_dead_letter", udf(LateDeadLetters(plan.topic), result_type=DataTypes.STRING(), func_type="pandas")
    )
    decoded = t_env.sql_query(
        f"SELECT {_quoted(RAW_COLUMNS)}, {', '.join(f'e.`{c}`' for c in ('dead_letter', *_EVENT_COLUMNS))} "
        f"FROM (SELECT *, decode_event({_quoted(RAW_COLUMNS)}) AS e FROM raw_events)"
    )

    operators = get_gateway().jvm.dev.loopline.streams
    positions = {name: i for i, name in enumerate(_DECODED_COLUMNS)}
    decoded_type = row_type(_DECODED_COLUMNS).get_java_type_info()
    invalid = OutputTag("invalid", Types.STRING()).get_java_output_tag()
    late = OutputTag("late", row_type({**_DECODED_COLUMNS, "behind_ms": "BIGINT"})).get_java_output_tag()
    valid = (
        t_env.to_data_stream(decoded)
        ._j_data_stream.process(operators.DeadLetterSplit(positions["dead_letter"], invalid), decoded_type)
        .name("route invalid events")
        .uid("route-invalid-events")
    )
    on_time = (
        valid.keyBy(operators.FieldKey(positions["partition"]))
        .process(operators.PartitionLateness(positions[_EVENT_TIME], plan.out_of_orderness_ms, late), decoded_type)
        .name("drop late events")
        .uid("drop-late-events")
    )
    t_env.create_temporary_view("invalid_events", t_env.from_data_stream(DataStream(valid.getSideOutput(invalid))))
    t_env.create_temporary_view("late_events", t_env.from_data_stream(DataStream(on_time.getSideOutput(late))))
    statements = t_env.create_statement_set()
    statements.add_insert_sql(
        "INSERT INTO dead_letters SELECT f0 FROM invalid_events UNION ALL "
        f"SELECT late_dead_letter({_quoted(RAW_COLUMNS)}, behind_ms) FROM late_events"
    )

    from feature_store.online_write import OnlineWriter  # Feast: on the client that builds the job, not on its workers

    offline_dirs = _offline_dirs(plan, settings)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, *_repo(settings), redis_cluster=settings.redis_cluster)
    for index, view in enumerate(plan.views):
        view_row = row_type(feature_columns(view)).get_java_type_info()
        rows, online_rows = windowed_rows(on_time, view, positions, settings.online_interval_ms)
        if tuple(writer.layout.views[view.name].windows) != tuple(view_windows(view.aggregations)):  # the rows' steps, in order
            raise ValueError(f"{view.name}: the registry's windows are not the plan's; compile the plan from the same registry")
        layout = writer.jvm_layout(view.name, view.feature_names, settings.max_batch_rows)
        online_rows.sinkTo(operators.OnlineRowSink(layout)).name(f"write {view.name} online").uid(f"write-online-{view.name}")
        held = (
            rows.keyBy(operators.FieldKey(-1))
            .process(operators.TimedBatches(settings.offline_flush_interval_ms, view_row), view_row)
            .name(f"hold {view.name} for the offline log")
            .uid(f"hold-offline-{view.name}")
        )
        t_env.create_temporary_view(f"held_{index}", t_env.from_data_stream(DataStream(held)))
        t_env.create_temporary_function(
            f"append_offline_{index}",
            udf(AppendOffline(view, offline_dirs[view.name]), result_type=DataTypes.BOOLEAN(), func_type="pandas"),
        )
        columns = _quoted([view.entity_key, _ROW_VERSION, *view.feature_names])
        statements.add_insert_sql(f"INSERT INTO written SELECT append_offline_{index}({columns}) FROM held_{index}")
    statements.attach_as_datastream()


def _repo(settings: JobSettings) -> tuple[Path, ...]:
    """The repo-path argument of the feature store's helpers: the settings' repo, or none for the default."""
    return () if settings.repo_path is None else (settings.repo_path,)


def _offline_dirs(plan: FeaturePlan, settings: JobSettings) -> dict[str, Path]:
    """Where each view's rows are appended: ``<offline_dir>/<view>``, or the path its FileSource declares in the repo."""
    from feature_store.config import REPO_PATH

    root, repo = settings.offline_dir, settings.repo_path or REPO_PATH
    return {
        view.name: root / view.name if root is not None else repo / (view.offline_path or f"data/offline/{view.name}")
        for view in plan.views
    }


def new_environment(settings: JobSettings, restore_from: str | None = None):
    """A StreamExecutionEnvironment configured for the job (``streams/flink_job.py``); with ``settings.metrics_port``
    its metrics (``late_events``, ``invalid_events``, ``feature_rows_written`` and Flink's own) at ``:<port>/metrics``."""
    return flink_environment(
        name=JOB_NAME, connector_jar=settings.connector_jar, operators_jar=settings.operators_jar, checkpoint_dir=settings.checkpoint_dir,
        checkpoint_interval_ms=settings.checkpoint_interval_ms, parallelism=settings.parallelism,
        metrics_port=settings.metrics_port, restore_from=restore_from, flush_interval_ms=settings.flush_interval_ms,
        max_batch_rows=settings.max_batch_rows, python_options=settings.python_options,
    )  # fmt: skip


def run_embedded(plan: FeaturePlan, settings: JobSettings, restore: bool = True) -> None:
    """Run the job on an embedded mini-cluster until it fails or the process is stopped.

    With ``restore`` it resumes from the newest retained checkpoint, when there is one; without,
    it rebuilds its state from the oldest retained event. JobStateError when the checkpoint cannot
    be restored (see ``streams/flink_job.run_job``).
    """
    def build(restore_from: str | None):
        env = new_environment(settings, restore_from)
        build_job(env, plan, settings, from_earliest=not restore)
        return env

    run_job(build, JOB_NAME, settings.checkpoint_dir, restore, "loopline stream submit --no-restore",
            bootstrap_servers=settings.bootstrap_servers, kafka_properties=settings.kafka_properties)


def submit_command(flink: Path, jobmanager: str, settings: JobSettings, source_topic: str | None, archives: JobArchives,
                   from_savepoint: str | None) -> list[str]:  # fmt: skip
    """The ``flink run`` command that submits this job, detached, to the cluster at ``jobmanager`` (REST host:port) at
    ``settings.parallelism``, with its environment and code (``archives``), restored from ``from_savepoint`` if given."""
    return flink_run_command(flink, jobmanager, "streams.feature_job", [settings.to_json(), source_topic or ""], archives,
                             parallelism=settings.parallelism, from_savepoint=from_savepoint)  # fmt: skip


def _main(settings_json: str, source_topic: str) -> None:
    """Entry point under ``flink run``: compile the plan from the Feast registry and submit the job to that cluster."""
    settings = JobSettings.from_json(settings_json)
    plan = registered_plan(settings.feast_registry_path, settings.redis_connection, settings.repo_path, source_topic or None)
    env = new_environment(settings)
    build_job(env, plan, settings)
    env.execute(JOB_NAME)


if __name__ == "__main__":
    _main(*sys.argv[1:3])
