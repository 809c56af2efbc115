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

Delivery reports are served on the event loop that appends: while acknowledgements are awaited it polls the
producer every :data:`POLL_S` (a timer, none while nothing is awaited; in ``async`` mode every
:data:`ASYNC_POLL_S`), and each report settles its request there. (A thread of its own polling the producer
cost a thread wake-up, the interpreter's lock and a hand-off back to the loop per report: a ninth of the scorer's
CPU at 1,000 requests/s.)
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
#: How often the loop serves delivery reports while an acknowledgement is awaited (``ack`` mode): at most this much
#: is added to a response's wait for its broker's acknowledgement.
POLL_S = 0.001
#: How often it serves them in ``async`` mode, where only a failure is reported to anyone (counted and logged).
ASYNC_POLL_S = 0.1


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
        self._awaited = 0  # acknowledgements awaited (ack mode) or records not yet reported (async mode)
        self._polling: asyncio.TimerHandle | None = None
        self._loop_thread: int | None = None

    def _poll(self) -> None:
        """Serve the delivery reports in (each settles its request), and poll again while any is awaited."""
        self._polling = None
        self._producer.poll(0)
        if self._awaited:
            self._schedule_poll()

    def _schedule_poll(self) -> None:
        if self._polling is None:
            interval = POLL_S if self.mode == "ack" else ASYNC_POLL_S
            self._polling = asyncio.get_running_loop().call_later(interval, self._poll)

    def _delivered(self, future: asyncio.Future | None, err: KafkaError | None, message: Message) -> None:
        self._awaited -= 1
        if err is not None:
            self._failures.inc()
            log.error("prediction for request %s not logged: %s", message.key(), err)
        if future is None:
            return
        if threading.get_ident() == self._loop_thread:
            _settle(future, err)
        else:  # served by close's flush, on another thread
            future.get_loop().call_soon_threadsafe(_settle, future, err)

    async def append(self, record: PredictionRecord, traceparent: str | None = None) -> bytes:
        """Log ``record`` (with a ``traceparent`` header when given): in ack mode, return once the broker has it. The
        record as logged (its JSON, which an HTTP door answers with: serialised once). Overloaded when the
        producer's queue is full; PredictionLogUnavailable when the broker does not acknowledge in time (ack mode)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future() if self.mode == "ack" else None
        if self._loop_thread is None:
            self._loop_thread = threading.get_ident()
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
        self._awaited += 1
        self._schedule_poll()
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
