"""The feedback joiner: predictions ⋈ late labels → labeled training examples, a PyFlink job.

    scoring.predictions (read_committed) ─► decode [Python] ──invalid──► events.dlq
    the project's labels ──────────────────► decode by its contract [Python] ──invalid──► events.dlq
        ─► key by event id ─► FeedbackJoin [JVM keyed state, event time] ─► example [Python] ─► training.examples

A label names the event it is about in the field the project declares (``labels.joins_on``), and a prediction by its
request's ``event_id``; its outcome (``labels.value``) becomes the example's label as a number (a binary outcome 1.0
or 0.0).

The long-lived state (a prediction waiting days for its label, a label waiting for its prediction)
lives in Flink keyed state, checkpointed with the sources' offsets; the examples are written in
Kafka transactions committed with each checkpoint. A job killed and restarted from its checkpoint
replays from the checkpointed offsets with the checkpointed state, and the examples of the replayed
stretch were never committed: nothing is lost or doubled for read_committed readers.

Time is the records' Kafka timestamps (when a prediction was logged, when a label was published),
with a bounded out-of-orderness; an event unlabeled when the watermark passes its prediction's
time plus ``horizon_ms`` yields an example with ``label: null`` (``feedback_loop/jvm``'s
``FeedbackJoin`` has the rules).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
from pyflink.common import Types
from pyflink.datastream.data_stream import DataStream
from pyflink.java_gateway import get_gateway
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from feedback_loop.joiner_settings import JoinerSettings
from schemas.contracts import ContractViolation
from schemas.project import LabelPlan
from schemas.records import PredictionRecord, TrainingExample
from streams.flink_job import STALL_AFTER_S, java_ints, run_job
from streams.flink_job import new_environment as flink_environment
from streams.flink_submit import JobArchives, flink_run_command
from streams.kafka_tables import KafkaTables, dead_letter, decode_or_dead_letter

JOB_NAME = "loopline-feedback-joiner"
#: The joiner's JVM operator; its jar also holds the feature job's operators (it keys with their FieldKey).
OPERATOR_SOURCES = Path(__file__).with_name("jvm") / "src"
_DECODED = DataTypes.ROW([DataTypes.FIELD(name, DataTypes.STRING()) for name in ("dead_letter", "event_id", "json")])


class DecodeRecords(ScalarFunction):
    """Validate a batch of one topic's records: (no dead letter, event id, what the example takes of the record, as
    JSON), or a dead letter. Predictions are decoded by their record type; with ``label`` the records are labels,
    decoded by the label source's contract, and what an example takes of one is its outcome, time and source.

    A prediction without an event id cannot be joined with any label: it is dead-lettered as ``no_event_id``.
    """

    def __init__(self, topic: str, label: LabelPlan | None = None) -> None:
        self.topic, self.label = topic, label

    def open(self, function_context: FunctionContext) -> None:
        self.invalid = function_context.get_metric_group().counter("invalid_records")

    def _decoded(self, key, value, partition, offset) -> tuple[str | None, str | None, str | None]:
        if self.label is not None:
            return self._label(key, value, partition, offset)
        record, letter = decode_or_dead_letter(PredictionRecord, JOB_NAME, self.topic, partition, offset, key, value)
        if record is None:
            return letter, None, None
        if not record.event_id:
            return (
                dead_letter(
                    JOB_NAME,
                    "no_event_id",
                    "the prediction names no event to join",
                    "event_id",
                    self.topic,
                    partition,
                    offset,
                    key,
                    value,
                ),
                None,
                None,
            )
        return None, record.event_id, record.model_dump_json()

    def _label(self, key, value, partition, offset) -> tuple[str | None, str | None, str | None]:
        plan = self.label
        try:
            record = plan.contract.decode(value or b"", plan.wire)
        except ContractViolation as violation:
            return (
                dead_letter(JOB_NAME, "invalid", str(violation), violation.field, self.topic, partition, offset, key, value),
                None,
                None,
            )
        outcome = getattr(record, plan.value)
        taken = {
            "value": float(outcome),
            "time_ms": getattr(record, plan.time_field) if plan.time_field else None,
            "source": None if plan.source_field is None else str(getattr(record, plan.source_field)),
        }
        return None, getattr(record, plan.joins_on), json.dumps(taken)

    def eval(self, key: pd.Series, value: pd.Series, partition: pd.Series, offset: pd.Series) -> pd.DataFrame:
        rows = [self._decoded(k, v, p, o) for k, v, p, o in zip(key, value, partition, offset, strict=True)]
        self.invalid.inc(sum(row[0] is not None for row in rows))
        return pd.DataFrame(rows, columns=["dead_letter", "event_id", "json"], dtype=object)


class BuildExamples(ScalarFunction):
    """Turn a batch of joined (prediction JSON, label JSON or null) into TrainingExample JSON."""

    def eval(self, prediction: pd.Series, label: pd.Series) -> pd.Series:
        return pd.Series([training_example(p, lbl) for p, lbl in zip(prediction, label, strict=True)], dtype=object)


def training_example(prediction_json: str, label_json: str | None) -> str:
    """The example of one scored event: the exact features the scorer used, and its label when one came (what
    ``DecodeRecords`` took of it: the outcome as a number, when it was known, its source)."""
    prediction = PredictionRecord.model_validate_json(prediction_json)
    label = json.loads(label_json) if label_json else {}
    example = TrainingExample(
        schema_version=TrainingExample.SCHEMA_VERSION,
        event_id=prediction.event_id,
        request_id=prediction.request_id,
        entity_keys=prediction.entity_keys,
        features=prediction.features,
        defaulted_features=prediction.defaulted_features,
        model_name=prediction.model_name,
        model_version=prediction.model_version,
        score=prediction.score,
        label=label.get("value"),
        label_source=label.get("source"),
        requested_at_ms=prediction.requested_at_ms,
        predicted_at_ms=prediction.scored_at_ms,
        label_time_ms=label.get("time_ms"),
        joined_at_ms=int(time.time() * 1000),
    )
    return example.model_dump_json()


def build_job(env, settings: JoinerSettings) -> None:
    """Add the joiner to a PyFlink StreamExecutionEnvironment."""
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set("table.exec.source.idle-timeout", f"{settings.idle_timeout_ms} ms")
    tables = KafkaTables(settings.bootstrap_servers, settings.group_id, settings.kafka_properties)
    source = {
        "properties.isolation.level": "read_committed",
        "scan.startup.mode": "group-offsets",
        # Nothing here is waited for within a checkpoint's interval: fetch 64 KiB or what half a second brings, not
        # each record as it lands (the broker's load).
        "properties.fetch.min.bytes": "65536",
        "properties.fetch.max.wait.ms": "500",
    }
    # The records' Kafka timestamps are the event time.
    event_time = (
        "`ts` TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL",
        f"WATERMARK FOR `ts` AS `ts` - INTERVAL '{settings.out_of_orderness_ms / 1000}' SECOND",
    )
    for name, topic in (("predictions_raw", settings.predictions_topic), ("labels_raw", settings.labels_topic)):
        t_env.execute_sql(tables.raw_source(name, topic, source, event_time))
    t_env.execute_sql(
        tables.exactly_once_sink(
            "examples",
            "`key` BYTES, `value` STRING",
            settings.examples_topic,
            "examples",
            {
                "key.format": "raw",
                "key.fields": "key",
                "value.format": "raw",
                "value.fields-include": "EXCEPT_KEY",
            },
        )
    )
    t_env.execute_sql(tables.dead_letter_sink(settings.dead_letter_topic))
    for name, records in (
        ("decode_prediction", DecodeRecords(settings.predictions_topic)),
        ("decode_label", DecodeRecords(settings.labels_topic, settings.label_plan())),
    ):
        t_env.create_temporary_function(name, udf(records, result_type=_DECODED, func_type="pandas"))
    t_env.create_temporary_function("example", udf(BuildExamples(), result_type=DataTypes.STRING(), func_type="pandas"))
    decoded = t_env.sql_query(
        "SELECT 'p' AS kind, d.dead_letter, d.event_id, d.json, `ts` FROM "
        "(SELECT decode_prediction(`key`, `value`, `partition`, `offset`) AS d, `ts` FROM predictions_raw) "
        "UNION ALL SELECT 'l' AS kind, d.dead_letter, d.event_id, d.json, `ts` FROM "
        "(SELECT decode_label(`key`, `value`, `partition`, `offset`) AS d, `ts` FROM labels_raw)"
    )
    t_env.create_temporary_view("decoded", decoded)
    statements = t_env.create_statement_set()
    statements.add_insert_sql("INSERT INTO dead_letters SELECT dead_letter FROM decoded WHERE dead_letter IS NOT NULL")
    # The rows keep their Kafka timestamp as the event time (the rowtime `ts`), and the watermarks with it.
    valid = t_env.sql_query("SELECT kind, event_id, json, `ts` FROM decoded WHERE dead_letter IS NULL")
    operators = get_gateway().jvm.dev.loopline.feedback
    joined_type = Types.ROW_NAMED(["event_id", "prediction", "label"], [Types.STRING(), Types.STRING(), Types.STRING()])
    key_selector = get_gateway().jvm.dev.loopline.streams.FieldKey(java_ints([1]))
    joined = (
        t_env.to_data_stream(valid)
        ._j_data_stream.keyBy(key_selector)
        .process(operators.FeedbackJoin(settings.horizon_ms), joined_type.get_java_type_info())
        .name("join predictions with labels")
        .uid("feedback-join")
    )
    t_env.create_temporary_view("joined", t_env.from_data_stream(DataStream(joined)))
    statements.add_insert_sql("INSERT INTO examples SELECT CAST(event_id AS BYTES), example(prediction, label) FROM joined")
    statements.attach_as_datastream()


def _flush_interval_ms(checkpoint_interval_ms: int) -> int:
    """The longest a record waits for its Python batch (decoding, building examples): examples are committed with each
    checkpoint, so a fifth of its interval (at most a second) delays none, and spares the feature job's 50 ms batches
    for each of three functions."""
    return max(50, min(1_000, checkpoint_interval_ms // 5))


def new_environment(settings: JoinerSettings, restore_from: str | None = None):
    """A StreamExecutionEnvironment configured for the joiner (``streams/flink_job.py``)."""
    return flink_environment(
        name=JOB_NAME,
        connector_jar=settings.connector_jar,
        operators_jar=settings.operators_jar,
        checkpoint_dir=settings.checkpoint_dir,
        checkpoint_interval_ms=settings.checkpoint_interval_ms,
        parallelism=settings.parallelism,
        metrics_port=settings.metrics_port,
        restore_from=restore_from,
        flush_interval_ms=_flush_interval_ms(settings.checkpoint_interval_ms),
        # A prediction waits up to the horizon (days) for its label: the state grows with every one scored.
        incremental_state=True,
    )


def run_embedded(settings: JoinerSettings, restore: bool = True, stall_after_s: float = STALL_AFTER_S) -> None:
    """Run the joiner on an embedded mini-cluster until it fails or the process is stopped; with ``restore``
    it resumes from its newest retained checkpoint. A run that completes no checkpoint for ``stall_after_s`` is run
    again (``streams/flink_job.run_job``)."""

    def build(restore_from: str | None):
        env = new_environment(settings, restore_from)
        build_job(env, settings)
        return env

    run_job(
        build,
        JOB_NAME,
        settings.checkpoint_dir,
        restore,
        "loopline feedback join --no-restore",
        bootstrap_servers=settings.bootstrap_servers,
        kafka_properties=settings.kafka_properties,
        stall_after_s=stall_after_s,
    )


def submit_command(
    flink: Path, jobmanager: str, settings: JoinerSettings, archives: JobArchives, from_savepoint: str | None
) -> list[str]:
    """The ``flink run`` command that submits the joiner, detached, to the cluster at ``jobmanager`` (REST host:port)
    at ``settings.parallelism``, with its environment and code (``archives``), restored from ``from_savepoint`` if
    given."""
    return flink_run_command(
        flink,
        jobmanager,
        "feedback_loop.joiner_job",
        [settings.to_json()],
        archives,
        parallelism=settings.parallelism,
        from_savepoint=from_savepoint,
    )


def _main(settings_json: str) -> None:
    """Entry point under ``flink run``: build the joiner and submit it to that cluster."""
    settings = JoinerSettings.from_json(settings_json)
    env = new_environment(settings)
    build_job(env, settings)
    env.execute(JOB_NAME)


if __name__ == "__main__":
    _main(sys.argv[1])
