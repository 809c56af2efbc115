"""The feature + prediction log for the HTTP and gRPC doors: one record per scored request on ``scoring.predictions``.

(The Kafka door writes its records inside its own transaction instead.) Appending never delays a
response: records are queued in the idempotent producer and delivered in the background; a record
Kafka does not acknowledge is counted (``loopline_scoring_prediction_log_failures_total``) and
logged with its request id.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, Message, Producer
from prometheus_client import Counter

from schemas.records import PredictionRecord
from schemas.validation import encode

log = logging.getLogger("loopline.scoring")


class PredictionLog:
    """Appends prediction records to ``topic``, keyed by request id."""

    def __init__(self, bootstrap_servers: str, topic: str, failures: Counter) -> None:
        self.topic = topic
        self._failures = failures
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                                   "linger.ms": 5, "compression.type": "lz4"})  # fmt: skip

    def _delivered(self, err: KafkaError | None, message: Message) -> None:
        if err is not None:
            self._failures.inc()
            log.error("prediction for request %s not logged: %s", message.key(), err)

    def append(self, record: PredictionRecord) -> None:
        """Queue ``record`` for the log (returns at once)."""
        try:
            self._producer.produce(self.topic, encode(record), record.request_id, on_delivery=self._delivered)
        except BufferError:
            self._failures.inc()
            log.error("prediction for request %s not logged: the producer's queue is full", record.request_id)
        self._producer.poll(0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued."""
        self._producer.flush(timeout_s)
