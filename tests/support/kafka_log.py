"""Reading what the system wrote to Kafka, as a test checks it: from a topic's beginning or from now on."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from schemas.validation import R, decode

#: The key of records a test writes as junk on purpose (bytes that are not the topic's contract, to show a reader
#: survives them). Topics are shared by the session's tests: `LogReader` leaves these out, and nothing else.
JUNK_KEY = b"junk"


class LogReader:
    """Reads a topic from its beginning (or, ``from_end``, from what is produced after it starts) as a read_committed
    consumer, keeping what it has seen."""

    def __init__(self, bootstrap: str, topic: str, from_end: bool = False) -> None:
        group = f"reader-{uuid.uuid4()}"
        if from_end:  # a test racing a fast writer must not first wade through every earlier test's records
            start_group_at_end(bootstrap, group, topic)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self.consumer.subscribe([topic])
        self.values: list[bytes] = []
        self._decoded: dict[type, list] = {}

    def poll(self) -> list[bytes]:
        """Everything read so far, after one more fetch, less the records keyed `JUNK_KEY`."""
        fetched = self.consumer.consume(5000, timeout=0.2)
        self.values += [m.value() for m in fetched if m.error() is None and m.key() != JUNK_KEY]
        return self.values

    def records(self, record_type: type[R]) -> list[R]:
        """Everything read so far, decoded as ``record_type``: a record that breaks the contract fails the test. Each
        record is decoded once (a wait that polls this over a topic of 100,000 records would otherwise spend its time
        decoding the same records again)."""
        values, decoded = self.poll(), self._decoded.setdefault(record_type, [])
        decoded += [decode(record_type, value) for value in values[len(decoded) :]]
        return list(decoded)

    def close(self) -> None:
        self.consumer.close()


def start_group_at_end(bootstrap: str, group: str, topic: str) -> None:
    """Commit ``group``'s offsets at the end of ``topic``: it sees only what is produced from now on."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = [TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]) for p in partitions]
    consumer.commit(offsets=ends, asynchronous=False)
    consumer.close()


def open_transaction_partitions(bootstrap: str, topic: str) -> list[int]:
    """The partitions of ``topic`` whose last stable offset is behind their end: records of a transaction not yet
    committed or aborted are there, and read_committed readers wait at its first."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = [TopicPartition(topic, p) for p in admin.list_topics(topic, timeout=10).topics[topic].partitions]

    def ends(isolation: IsolationLevel) -> dict[int, int]:
        asked = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, isolation_level=isolation)
        return {tp.partition: future.result(10).offset for tp, future in asked.items()}

    stable, written = ends(IsolationLevel.READ_COMMITTED), ends(IsolationLevel.READ_UNCOMMITTED)
    return sorted(p for p in written if stable[p] < written[p])
