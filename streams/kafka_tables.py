"""The Kafka tables of Loopline's PyFlink jobs: raw records in, exactly-once sinks out, and the dead letters they write.

A source keeps each record's key and value as raw bytes, with its partition and offset, so a record that breaks its
contract is dead-lettered exactly as it came and names where it was read. Sinks write in Kafka transactions that commit
with each checkpoint: a restarted job replays the records since its last checkpoint, and what it wrote for them before
the failure was never committed, so read_committed readers see each record once. The feature job
(``streams/feature_job.py``) and the feedback joiner (``feedback_loop/joiner_job.py``) declare theirs with these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schemas.kafka_config import Requirement, client_settings
from schemas.records import DeadLetterRecord
from schemas.validation import ContractViolation, R, decode, encode

#: The columns of every raw source: the record as it came, and where it was read.
RAW_COLUMNS = {"key": "BYTES", "value": "BYTES", "partition": "INT", "offset": "BIGINT"}


#: The tables' client properties the jobs' reads rely on (their consumer group's offsets, read_committed under the
#: exactly-once sinks, the start of a new group); the others (fetch sizes, timeouts) are tuning a user may override.
_REQUIRED_PROPERTIES = frozenset({"group.id", "isolation.level", "auto.offset.reset"})


def kafka_options(bootstrap_servers: str, kafka_properties: Mapping[str, str], options: Mapping[str, str]) -> str:
    """The WITH clause of a Kafka table: ``options``, the brokers and the client properties (security settings). The
    table's ``properties.*`` options are Loopline's defaults under the user's ``kafka_properties``, but for those the
    job relies on (``_REQUIRED_PROPERTIES``), which a contradicting client property is refused for
    (KafkaSettingConflict)."""
    own = {key.removeprefix("properties."): value for key, value in options.items() if key.startswith("properties.")}
    why = "the job's exactly-once reads and writes rely on it"
    required = {key: Requirement(value, why) for key, value in own.items() if key in _REQUIRED_PROPERTIES}
    defaults = {key: value for key, value in own.items() if key not in _REQUIRED_PROPERTIES}
    client = client_settings(bootstrap_servers, kafka_properties, defaults=defaults, required=required)
    table = {key: value for key, value in options.items() if not key.startswith("properties.")}
    every = {"connector": "kafka", **{f"properties.{key}": value for key, value in client.items()}, **table}
    return ", ".join(f"'{key}' = '{str(value).replace(chr(39), chr(39) * 2)}'" for key, value in every.items())


@dataclass(frozen=True)
class KafkaTables:
    """The Kafka tables of one job, reading as the consumer group ``group_id`` from the brokers at ``bootstrap_servers``
    with the client properties ``kafka_properties``; its transactional ids start with the group's name."""

    bootstrap_servers: str
    group_id: str
    kafka_properties: Mapping[str, str] = field(default_factory=dict)

    def raw_source(self, name: str, topic: str, options: Mapping[str, str], extra_columns: Sequence[str] = ()) -> str:
        """``CREATE TABLE name``: ``topic``'s records as ``RAW_COLUMNS``, read from the group's offsets unless
        ``options`` (start, fetch sizes, isolation) say otherwise, with the job's ``extra_columns`` (metadata, a
        watermark)."""
        columns = [
            "`key` BYTES",
            "`value` BYTES",
            "`partition` INT METADATA VIRTUAL",
            "`offset` BIGINT METADATA VIRTUAL",
            *extra_columns,
        ]
        every = {
            "topic": topic,
            "properties.group.id": self.group_id,
            "properties.auto.offset.reset": "earliest",
            **options,
            "key.format": "raw",
            "key.fields": "key",
            "value.format": "raw",
            "value.fields-include": "EXCEPT_KEY",
        }
        return f"CREATE TABLE {name} ({', '.join(columns)}) WITH ({self._with(every)})"

    def exactly_once_sink(self, name: str, columns: str, topic: str, purpose: str, options: Mapping[str, str]) -> str:
        """``CREATE TABLE name (columns)`` writing to ``topic`` in transactions committed with each checkpoint, their
        ids prefixed ``<group>-<purpose>``; ``options`` give its formats."""
        every = {
            "topic": topic,
            **options,
            "sink.delivery-guarantee": "exactly-once",
            "sink.transactional-id-prefix": f"{self.group_id}-{purpose}",
            # The broker's limit (15 min): a job down for longer than this loses its open transaction's records.
            "properties.transaction.timeout.ms": "900000",
        }
        return f"CREATE TABLE {name} ({columns}) WITH ({self._with(every)})"

    def dead_letter_sink(self, topic: str) -> str:
        """``CREATE TABLE dead_letters``: one ``value`` column of ``dead_letter`` JSON, written exactly once to ``topic``."""
        return self.exactly_once_sink("dead_letters", "`value` STRING", topic, "dlq", {"format": "raw"})

    def _with(self, options: Mapping[str, str]) -> str:
        return kafka_options(self.bootstrap_servers, self.kafka_properties, options)


def dead_letter(
    consumer: str,
    reason: str,
    error: str,
    error_field: str | None,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
) -> str:
    """The dead letter (DeadLetterRecord JSON) of the raw record at ``partition``/``offset`` of ``topic`` that the job
    ``consumer`` could not process, and why: its ``reason``, the ``error`` and the field at fault."""
    return encode(
        DeadLetterRecord.for_payload(
            reason=reason,
            error=error,
            error_field=error_field,
            source_topic=topic,
            source_partition=int(partition),
            source_offset=int(offset),
            key=key,
            payload=value,
            consumer=consumer,
        )
    ).decode()


def decode_or_dead_letter(
    record_type: type[R], consumer: str, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> tuple[R | None, str | None]:
    """The raw record's value as ``record_type`` (and no dead letter), or no record and its dead letter: ``invalid`` when
    it breaks the contract, ``unprocessable`` for anything else."""
    try:
        return decode(record_type, value or b""), None
    except ContractViolation as violation:
        return None, dead_letter(consumer, "invalid", str(violation), violation.field, topic, partition, offset, key, value)
    except Exception as err:  # a record must never stop the job, whatever is wrong with it
        return None, dead_letter(consumer, "unprocessable", repr(err), None, topic, partition, offset, key, value)
