"""The feature + prediction log for the HTTP and gRPC doors: each scored request on ``scoring.predictions``.

(The Kafka door writes its records inside its own transaction instead.) Records go through an
idempotent producer, keyed by request id, at least once:

* ``ack`` mode (the default): ``append`` returns once the broker has acknowledged the record, so
  a client that got its score knows the record is in the log. No acknowledgement within
  ``ack_timeout_s`` is a ``PredictionLogUnavailable`` (503: retry); the record may still arrive,
  and readers deduplicate by request id.
* ``async`` mode: ``append`` returns once the record is queued; a record Kafka finally refuses is
  counted (``loopline_scoring_prediction_log_failures_total``) and logged with its request id.

Either way a full producer queue refuses the request (``Overloaded``, 503) rather than dropping
its record, and ``close`` delivers everything queued before the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Literal

from confluent_kafka import KafkaError, Message, Producer
from prometheus_client import Counter

from online.errors import Overloaded, PredictionLogUnavailable
from schemas.kafka_config import producer_settings
from schemas.records import PredictionRecord
from schemas.validation import encode

log = logging.getLogger(__name__)
LogMode = Literal["ack", "async"]


class PredictionLog:
    """Appends prediction records to ``topic``, keyed by request id (see the module's doc for the modes)."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        failures: Counter,
        mode: LogMode = "ack",
        ack_timeout_s: float = 5.0,
        max_queued: int = 100_000,
        client_config: Mapping[str, str] | None = None,
    ) -> None:
        self.topic, self.mode, self.ack_timeout_s = topic, mode, ack_timeout_s
        self._failures = failures
        self._producer = Producer(
            producer_settings(
                bootstrap_servers,
                client_config,
                {
                    # In ack mode every response waits for its record: send within a millisecond, and without Nagle's
                    # delay (small requests otherwise wait for the previous one's TCP acknowledgement: ~40 ms).
                    "linger.ms": 1 if mode == "ack" else 5,
                    "socket.nagle.disable": True,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": max_queued,
                },
            )
        )
        self._closed = threading.Event()
        # Delivery reports are served on a thread of their own, so the event loop never waits on Kafka.
        self._poller = threading.Thread(target=self._poll, name="prediction-log", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.1)

    def _delivered(self, future: asyncio.Future | None, err: KafkaError | None, message: Message) -> None:
        if err is not None:
            self._failures.inc()
            log.error("prediction for request %s not logged: %s", message.key(), err)
        if future is not None:
            future.get_loop().call_soon_threadsafe(_settle, future, err)

    async def append(self, record: PredictionRecord, traceparent: str | None = None) -> bytes:
        """Log ``record`` (with a ``traceparent`` header when given): in ack mode, return once the broker has it. The
        record as logged (its JSON, which an HTTP door answers with: serialised once). Overloaded when the
        producer's queue is full; PredictionLogUnavailable when the broker does not acknowledge in time (ack mode)."""
        future = asyncio.get_running_loop().create_future() if self.mode == "ack" else None
        payload = encode(record)
        try:
            self._producer.produce(
                self.topic,
                payload,
                record.request_id,
                on_delivery=lambda err, msg: self._delivered(future, err, msg),
                headers=None if traceparent is None else [("traceparent", traceparent)],
            )
        except BufferError:
            raise Overloaded("the prediction log's queue is full (is Kafka reachable?); retry later") from None
        if future is None:
            return payload
        try:
            async with asyncio.timeout(self.ack_timeout_s):
                await future
        except TimeoutError:
            raise PredictionLogUnavailable(f"Kafka did not acknowledge the prediction within {self.ack_timeout_s:g} s") from None
        return payload

    def close(self, timeout_s: float = 10.0) -> int:
        """Deliver what is queued (waiting at most ``timeout_s``); the number of records left undelivered."""
        left = self._producer.flush(timeout_s)
        self._closed.set()
        self._poller.join()
        if left:
            log.error("%d prediction records not delivered before shutdown", left)
        return left


def _settle(future: asyncio.Future, err: KafkaError | None) -> None:
    if future.done():  # its request timed out already
        return
    if err is None:
        future.set_result(None)
    else:
        future.set_exception(PredictionLogUnavailable(f"Kafka refused the prediction record: {err}"))
