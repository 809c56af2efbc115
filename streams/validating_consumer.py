"""Read topics, validate every record against its contract, dead-letter the bad ones.

Offsets are committed only after the dead-letter records of a batch are acknowledged by
Kafka, so a crash can repeat work but never lose a record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pydantic import BaseModel

from schemas.kafka_config import consumer_settings, producer_settings
from schemas.records import DeadLetterRecord
from schemas.validation import ContractViolation, encode

#: How a topic's records are read: the bytes of one record to its model, or ContractViolation.
Decoder = Callable[[bytes], BaseModel]

_BATCH = 500


@dataclass
class TopicCounts:
    """Records seen on one topic: valid ones and those sent to the dead-letter topic."""

    valid: int = 0
    dead_lettered: int = 0


class ValidatingConsumer:
    """A consumer-group member that validates records of the given topics until it has caught up."""

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        topics: Mapping[str, Decoder],
        dead_letter_topic: str,
        consumer_name: str = "validator",
        client_config: Mapping[str, str] | None = None,
    ) -> None:
        """``topics``: each topic read with how its records are decoded (a project's events by their contract, in their
        wire format; Loopline's records by their type). ``client_config``: extra librdkafka settings (security.protocol,
        sasl.*, ssl.*)."""
        self.decoders = dict(topics)
        self.dead_letter_topic = dead_letter_topic
        self.consumer_name = consumer_name
        self._consumer = Consumer(consumer_settings(bootstrap_servers, client_config, group_id))
        self._dead_letters = Producer(producer_settings(bootstrap_servers, client_config))
        self._dead_letter_failures: list[KafkaError] = []

    def _assign_from_committed(self) -> dict[tuple[str, int], int]:
        """Assign every partition at the group's committed offset; return the end offsets to reach."""
        metadata = self._consumer.list_topics(timeout=10.0)
        partitions = []
        for name in self.decoders:
            if name not in metadata.topics:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {name} does not exist"))
            partitions += [TopicPartition(name, p) for p in metadata.topics[name].partitions]
        committed = self._consumer.committed(partitions, timeout=10.0)
        for tp in committed:
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING
        self._consumer.assign(committed)
        ends = {}
        for tp in committed:
            low, high = self._consumer.get_watermark_offsets(tp, timeout=10.0)
            start = low if tp.offset < 0 else tp.offset
            if high > start:
                ends[(tp.topic, tp.partition)] = high
        return ends

    def run_until_caught_up(
        self,
        timeout_s: float = 60.0,
        on_valid: Callable[[str, BaseModel], None] | None = None,
    ) -> dict[str, TopicCounts]:
        """Validate everything up to the end offsets seen at start; return counts per topic.

        Raises TimeoutError if not caught up within ``timeout_s``.
        """
        counts = {name: TopicCounts() for name in self.decoders}
        remaining = self._assign_from_committed()
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not caught up after {timeout_s:.0f} s; still behind on {sorted(remaining)}")
            batch = self._consumer.consume(_BATCH, timeout=0.5)
            for msg in batch:
                if msg.error():
                    raise KafkaException(msg.error())
                self._handle(msg, counts, on_valid)
                position = (msg.topic(), msg.partition())
                if position in remaining and msg.offset() + 1 >= remaining[position]:
                    del remaining[position]
            if batch:
                self._commit_after_dead_letters()
        return counts

    def _handle(self, msg, counts: dict[str, TopicCounts], on_valid) -> None:
        try:
            record = self.decoders[msg.topic()](msg.value() or b"")
        except ContractViolation as violation:
            dead = DeadLetterRecord.for_payload(
                reason="invalid",
                error=str(violation),
                error_field=violation.field,
                source_topic=msg.topic(),
                source_partition=msg.partition(),
                source_offset=msg.offset(),
                key=msg.key(),
                payload=msg.value(),
                consumer=self.consumer_name,
            )
            self._dead_letters.produce(
                self.dead_letter_topic, encode(dead), msg.topic(), on_delivery=self._on_dead_letter_delivery
            )
            counts[msg.topic()].dead_lettered += 1
            return
        counts[msg.topic()].valid += 1
        if on_valid:
            on_valid(msg.topic(), record)

    def _on_dead_letter_delivery(self, err: KafkaError | None, _msg) -> None:
        if err is not None:
            self._dead_letter_failures.append(err)

    def _commit_after_dead_letters(self) -> None:
        """Commit the batch's offsets only once its dead letters are durable; never skip a record."""
        if self._dead_letters.flush(30.0) != 0:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "dead-letter records not acknowledged"))
        if self._dead_letter_failures:
            raise KafkaException(self._dead_letter_failures[0])
        self._consumer.commit(asynchronous=False)

    def close(self) -> None:
        """Leave the group and release the clients."""
        self._dead_letters.flush(30.0)
        self._consumer.close()
