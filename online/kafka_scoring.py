"""What both Kafka doors share: their clients' settings, and how a polled batch of requests becomes the records
to log (each request's prediction, or its dead letter saying why not)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from confluent_kafka import Consumer, Message

from online.errors import ScoringError
from online.request_limits import RequestLimits, parse_request
from online.scorer import Scorer
from online.tracing import RequestTrace, RequestTracer, log_suffix
from schemas.kafka_config import consumer_settings
from schemas.records import DeadLetterRecord
from schemas.validation import encode

log = logging.getLogger(__name__)
DOOR = "kafka"
CONSUMER_NAME = f"loopline-scorer/{DOOR}"
#: A partition of a topic: (topic, number).
Partition = tuple[str, int]


class Output(NamedTuple):
    """One record to log for a request: its prediction or its dead letter."""

    topic: str
    value: bytes
    key: str | None
    #: The request's trace, when traced: the record carries its ``traceparent``, and the trace ends once the record
    #: is logged.
    trace: RequestTrace | None = None
    #: When the record was ready to log (perf_counter); why the request was dead-lettered, if it was.
    made_at: float = 0.0
    error: str | None = None

    @property
    def headers(self) -> list[tuple[str, str]] | None:
        """The record's headers: the request's ``traceparent`` when it is traced."""
        return None if self.trace is None else [("traceparent", self.trace.traceparent())]


#: The defaults every client of a Kafka door shares: its broker calls are chains of small requests, and Nagle's
#: algorithm would hold each for the previous one's ACK.
DOOR_CLIENT_DEFAULTS: dict[str, object] = {"socket.nagle.disable": True}


def door_consumer_settings(bootstrap_servers: str, client_config: Mapping[str, str] | None, group_id: str) -> dict[str, object]:
    """A Kafka door's request consumer's settings, as a member of ``group_id``."""
    # A member killed without leaving holds its partitions this long: 10 s rather than 45 s.
    defaults = {**DOOR_CLIENT_DEFAULTS, "session.timeout.ms": 10_000}
    return consumer_settings(bootstrap_servers, client_config, group_id, defaults)


@dataclass(frozen=True)
class RequestScoring:
    """How a Kafka door turns the requests it polled into the records it logs (both doors' common part).

    A polled batch is scored ``max_in_flight`` requests at a time: each request's feature budget starts when it is
    submitted, so a whole batch submitted at once would spend its budget waiting behind its own siblings' parsing.
    """

    scorer: Scorer
    requests_topic: str
    predictions_topic: str
    dead_letter_topic: str
    limits: RequestLimits = RequestLimits()
    max_in_flight: int = 64
    tracer: RequestTracer | None = None

    async def outputs(
        self, messages: list[Message], on_chunk: Callable[[list[Message], list[Output]], None] | None = None
    ) -> list[Output]:
        """The record to log for each of ``messages``, in their order; ``on_chunk(messages, outputs)`` is given each
        chunk's as soon as it is scored."""
        outputs: list[Output] = []
        for start in range(0, len(messages), self.max_in_flight):
            chunk = messages[start : start + self.max_in_flight]
            scored = await asyncio.gather(*(self.output(m) for m in chunk))
            if on_chunk is not None:
                on_chunk(chunk, scored)
            outputs += scored
        return outputs

    async def output(self, message: Message) -> Output:
        """The record to log for one request: its prediction, or a dead letter saying why not. A scorer merely
        busy or not ready is waited out: the batch is the door's to finish."""
        began = time.perf_counter()
        request_id = "-"
        trace = None if self.tracer is None else self.tracer.begin(_header(message, "traceparent"), began)
        try:
            request = parse_request(message.value() or b"", self.limits)
            request_id = request.request_id
            if trace is not None:
                trace.stage("receive", began, time.perf_counter())
            while True:
                try:
                    record = await self.scorer.score(request, trace, paced=True)
                    break
                except ScoringError as err:
                    if not err.retriable:
                        raise
                    await asyncio.sleep(0.005)
        except Exception as err:
            reason, field = (err.reason, err.field) if isinstance(err, ScoringError) else ("scoring_failed", None)
            where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
            if not isinstance(err, ScoringError) or err.http_status >= 500:
                log.exception("request %s at %s failed", request_id, where)
            self.scorer.metrics.requests.labels(DOOR, reason).inc()
            log.info(
                "request %s %.2f ms dead-lettered (%s) from %s%s",
                request_id,
                (time.perf_counter() - began) * 1000,
                reason,
                where,
                log_suffix(trace),
            )
            value = _dead_letter(message, reason, str(err), field)
            return Output(self.dead_letter_topic, value, message.topic(), trace, time.perf_counter(), reason)
        self.scorer.metrics.requests.labels(DOOR, "200").inc()
        log.info("request %s %.2f ms ok%s", request.request_id, (time.perf_counter() - began) * 1000, log_suffix(trace))
        return Output(self.predictions_topic, encode(record), request.request_id, trace, time.perf_counter())

    def logged(self, outputs: list[Output], at: float, delivery: str) -> None:
        """``outputs`` are logged (acknowledged, or their transaction committed) as of ``at``: their traces end."""
        if self.tracer is None:
            return
        for output in outputs:
            if output.trace is not None:
                output.trace.stage(
                    "log_prediction",
                    output.made_at,
                    at,
                    kind="PRODUCER",
                    **{"messaging.destination.name": output.topic, "loopline.kafka_delivery": delivery},
                )
                self.tracer.finish(
                    output.trace,
                    f"score {self.requests_topic}",
                    "CONSUMER",
                    at,
                    error=output.error,
                    **{"loopline.request_id": output.key or "-", "messaging.system": "kafka"},
                )


def _header(message: Message, name: str) -> bytes | None:
    """The value of a record's header ``name`` (the last, if repeated), or None."""
    found = None
    for key, value in message.headers() or ():
        if key == name:
            found = value
    return found


def _dead_letter(message: Message, reason: str, error: str, field: str | None) -> bytes:
    return encode(
        DeadLetterRecord.for_payload(
            reason=reason,
            error=error,
            error_field=field,
            source_topic=message.topic(),
            source_partition=message.partition(),
            source_offset=message.offset(),
            key=message.key(),
            payload=message.value(),
            consumer=CONSUMER_NAME,
        )
    )


def take(consumer: Consumer, max_records: int) -> tuple[list[Message], bool]:
    """Wait (briefly) for a request, then take what else has already arrived, up to ``max_records``; and whether
    work is waiting that this poll did not return."""
    first = consumer.poll(0.1)
    messages = [] if first is None else [first, *consumer.consume(max_records - 1, 0)]
    messages = [m for m in messages if m.error() is None]
    return messages, not messages and _work_waiting(consumer)


def _work_waiting(consumer: Consumer) -> bool:
    """Whether an assigned partition has requests this member has not consumed, or a position it cannot tell (its
    committed offset not fetched): from what the client already knows, no broker call."""
    assigned = consumer.assignment()
    if not assigned:
        return False
    for position in consumer.position(assigned):
        _, high = consumer.get_watermark_offsets(position, cached=True)
        if position.offset < 0 or (high >= 0 and high > position.offset):
            return True
    return False
