"""The Kafka front door: ``scoring.requests`` → scorer → ``scoring.predictions``, exactly once.

Each polled batch of requests is scored concurrently (so the dynamic batcher fills), then its
prediction records, its dead letters and the offsets just past the batch are committed in one
Kafka transaction. A request that fails for any reason is dead-lettered with the reason (never
retried forever, never allowed to stop the door), except while the scorer is merely busy or not
ready, which is waited out. A consumer killed mid-batch leaves an aborted transaction: its
records are never visible to ``read_committed`` readers, and its requests are consumed again from
the last committed offsets. So every request yields exactly one record, and none is lost.

Every broker call runs off the event loop, on the door's own threads, with a timeout:

* a retriable error (a broker restarting, a coordinator moving) is retried;
* an abortable one aborts the transaction, and the door rewinds to the last committed offsets;
* any other (fenced, a transaction timed out by the coordinator) re-creates the producer, which
  fences its predecessor's transaction, and the door rewinds likewise;
* a transaction that does not settle within ``1.5 × broker_timeout_s`` (librdkafka's
  ``send_offsets_to_transaction`` can block past its timeout when the group coordinator goes
  away: librdkafka issues 5456, 5511) is abandoned the same way: its producer is replaced, which
  fences it, and its thread is left to return whenever it does.

The commit of one batch overlaps the scoring of the next; the next transaction begins only once
the previous one is settled. Before this member gives up partitions in a rebalance it waits for
that commit, so the next owner starts exactly where this one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from online.doors import Progress
from online.errors import ScoringError
from online.request_limits import RequestLimits, parse_request
from online.scorer import Scorer
from online.tracing import RequestTrace, RequestTracer, log_suffix
from schemas.records import DeadLetterRecord
from schemas.validation import encode

log = logging.getLogger(__name__)
DOOR = "kafka"
CONSUMER_NAME = f"loopline-scorer/{DOOR}"
#: Pause between tries of a broker call that failed with a retriable error.
_RETRY_PAUSE_S = 0.5
#: A transaction not settled within this many broker timeouts is abandoned (its calls retry within that).
_SETTLE_FACTOR = 1.5
#: A transaction begun just after the last one committed finds its markers still being written: the coordinator answers
#: CONCURRENT_TRANSACTIONS and the client retries after ``retry.backoff.ms``, 100 ms by default in librdkafka, so every
#: back-to-back transaction took 105 ms p50 here (``send_offsets_to_transaction`` alone 104 ms;
#: benchmarks/kafka_transactions.py). The Java client retries that answer to AddPartitionsToTxn after 20 ms
#: (KAFKA-5477); librdkafka has no such special case, so the door lowers the first backoff of every retried request of
#: this producer to 20 ms: 28 ms p50 a transaction. The backoff still grows exponentially (``retry.backoff.max.ms``)
#: when a broker is away. A client_config that sets it wins.
TRANSACTION_RETRY_BACKOFF = {"retry.backoff.ms": 20}
T = TypeVar("T")


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
        return None if self.trace is None else [("traceparent", self.trace.traceparent())]


class KafkaScoringDoor:
    """Consumes score requests as one member of ``group_id`` and logs exactly one record for each."""

    name = DOOR

    def __init__(
        self,
        scoring: RequestScoring,
        *,
        bootstrap_servers: str,
        group_id: str,
        transactional_id: str,
        client_config: Mapping[str, str] | None = None,
        max_poll_records: int = 256,
        broker_timeout_s: float = 10.0,
    ) -> None:
        """Consumes ``scoring.requests_topic``; a polled batch (up to ``max_poll_records``) is one transaction."""
        self.scoring, self.scorer, self.requests_topic = scoring, scoring.scorer, scoring.requests_topic
        self.max_poll_records, self.broker_timeout_s = max_poll_records, broker_timeout_s
        client, self._consumer_config = door_clients(bootstrap_servers, client_config, group_id)
        self._consumer = Consumer(self._consumer_config)
        # A producer re-created with the same transactional id fences off its predecessor's open transaction.
        self._producer_config = {**TRANSACTION_RETRY_BACKOFF, **client, "transactional.id": transactional_id}
        self._producer: Producer | None = None
        self._poller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-poll")
        self._committer = self._new_committer()
        self._committing: Future[bool] | None = None
        self._stopping = threading.Event()
        self._progress = Progress()
        #: Requests of a transaction that did not commit are owed until a later one commits: an idle poll
        #: meanwhile is no progress (the consumer may be unable to fetch them again).
        self._owed = False

    def stalled_s(self) -> float:
        """Seconds this door has held polled requests without committing any."""
        return self._progress.stalled_s()

    # Broker calls (on the door's threads) ---------------------------------------------------------

    def _retrying(self, call: Callable[..., T], *args) -> T:
        """``call(*args)``, tried again after each retriable error until it succeeds or the door stops."""
        while True:
            try:
                return call(*args)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable() or self._stopping.is_set():
                    raise
                log.warning("Kafka %s: %s; retrying", getattr(call, "__name__", "call"), error.str())
                time.sleep(_RETRY_PAUSE_S)

    def _new_producer(self) -> Producer | None:
        """A transactional producer, its transactions initialised (fencing any predecessor's); None if the
        door stopped before the broker answered."""
        while not self._stopping.is_set():
            producer = Producer(self._producer_config)
            try:
                self._retrying(producer.init_transactions, self.broker_timeout_s)
                return producer
            except KafkaException as exc:
                log.warning("Kafka init_transactions: %s; trying a new producer", exc.args[0].str())
                time.sleep(_RETRY_PAUSE_S)
        return None

    def _take(self) -> tuple[list[Message], object, bool]:
        """:func:`take`, with the consumer group's metadata as of this poll (a transaction for a batch polled in
        an older generation is refused by the broker)."""
        messages, waiting = take(self._consumer, self.max_poll_records)
        return messages, self._consumer.consumer_group_metadata(), waiting

    @staticmethod
    def _new_committer() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="txn-commit")

    def _transact(self, producer: Producer, outputs: list[Output], offsets: list[TopicPartition], group_metadata) -> bool:
        """Produce ``outputs`` and commit ``offsets`` in one transaction of ``producer``; False when it was aborted."""
        try:
            producer.begin_transaction()
            for output in outputs:
                while True:
                    try:
                        producer.produce(output.topic, output.value, output.key, headers=output.headers)
                        break
                    except BufferError:  # the queue is full while the broker is slow: make room
                        producer.poll(0.1)
            self._retrying(producer.send_offsets_to_transaction, offsets, group_metadata, self.broker_timeout_s)
            self._retrying(producer.commit_transaction, self.broker_timeout_s)
        except KafkaException as exc:
            if producer is self._producer:  # not abandoned meanwhile (see _finish_commit)
                self._recover(producer, exc.args[0])
            return False
        self._owed = False
        self._progress.progressed(still_holding=True)
        self.scoring.logged(outputs, time.perf_counter(), "exactly_once")
        return True

    def _recover(self, producer: Producer, error: KafkaError) -> None:
        """After a failed transaction: abort it when the broker allows, else start over with a new producer."""
        log.warning("Kafka transaction failed (%s); its requests will be consumed again", error.str())
        if error.txn_requires_abort():
            try:
                self._retrying(producer.abort_transaction, self.broker_timeout_s)
                return
            except KafkaException as exc:
                log.warning("Kafka abort_transaction: %s", exc.args[0].str())
        self._producer = self._new_producer()

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset: the requests of transactions that
        did not commit are consumed again. A consumer that cannot tell its committed offsets (its coordinator
        lost, as after a broker restart) is replaced: a new member starts from the committed offsets anyway."""
        try:
            committed = self._consumer.committed(self._consumer.assignment(), timeout=self.broker_timeout_s)
        except KafkaException as exc:
            log.warning("Kafka committed offsets: %s; rejoining the group with a new consumer", exc.args[0].str())
            self._join()
            return
        for partition in committed:
            if partition.offset < 0:
                partition.offset = OFFSET_BEGINNING
            self._consumer.seek(partition)

    def _join(self) -> None:
        """Join the group with a new consumer; the old one leaves on a thread of its own (it may hang as its
        calls did)."""
        old = self._consumer
        threading.Thread(target=old.close, name="kafka-leave", daemon=True).start()
        self._consumer = Consumer(self._consumer_config)
        self._consumer.subscribe([self.requests_topic], on_revoke=self._finish_commit)

    def _finish_commit(self, *_) -> bool:
        """Wait for the transaction being committed, if any; whether it committed. (Also the consumer's
        on_revoke: before partitions move to another member, their offsets are committed.)"""
        committing, self._committing = self._committing, None
        if committing is None:
            return True
        try:
            return committing.result(timeout=_SETTLE_FACTOR * self.broker_timeout_s)
        except FutureTimeout:
            log.error("Kafka transaction not settled after %.0f s (a broker call ignored its timeout); "
                      "abandoning its producer, its requests will be consumed again", _SETTLE_FACTOR * self.broker_timeout_s)  # fmt: skip
            self._committer.shutdown(wait=False)  # its thread stays blocked in librdkafka until it returns
            self._committer = self._new_committer()
            self._producer = self._new_producer()  # fences the abandoned transaction
            return False

    @staticmethod
    def _next_offsets(messages: list[Message]) -> list[TopicPartition]:
        """Per partition in ``messages``, the offset just past the last one: where to resume."""
        ends: dict[tuple[str, int], int] = {}
        for m in messages:
            ends[m.topic(), m.partition()] = max(ends.get((m.topic(), m.partition()), -1), m.offset() + 1)
        return [TopicPartition(topic, partition, offset) for (topic, partition), offset in ends.items()]

    # The loop ------------------------------------------------------------------------------------

    async def _settle(self) -> bool:
        """Wait for the transaction in flight; if it did not commit, rewind the consumer. Whether it committed."""
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(self._poller, self._finish_commit)
        if not committed:
            self._owed = True
            await loop.run_in_executor(self._poller, self._rewind)
        return committed

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, score and log transactionally until ``stop`` is set; joins the group once a model is ready."""
        loop = asyncio.get_running_loop()
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._stopping.set())
        try:
            self._producer = await loop.run_in_executor(self._committer, self._new_producer)
            ready = asyncio.ensure_future(self.scorer.wait_ready())
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            self._consumer.subscribe([self.requests_topic], on_revoke=self._finish_commit)
            while not stop.is_set():
                messages, group_metadata, waiting = await loop.run_in_executor(self._poller, self._take)
                if not messages:
                    await self._settle()
                    if waiting or self._owed:
                        self._progress.holding()
                    else:
                        self._progress.progressed(still_holding=False)
                    continue
                self._progress.holding()
                outputs = await self.scoring.outputs(messages)
                if not await self._settle():
                    continue  # the previous batch was rewound; this one comes again after it
                self._committing = self._committer.submit(
                    self._transact, self._producer, outputs, self._next_offsets(messages), group_metadata
                )
            await self._settle()
        finally:
            stopping.cancel()
            self._stopping.set()
            await loop.run_in_executor(self._poller, self._consumer.close)
            self._poller.shutdown(wait=False)
            self._committer.shutdown(wait=False)


# Shared with the at-least-once door (online/kafka_door_at_least_once.py) --------------------------


def door_clients(bootstrap_servers: str, client_config: Mapping[str, str] | None, group_id: str) -> tuple[dict, dict]:
    """(the settings every client of a Kafka door shares, its request consumer's settings as a member of ``group_id``)."""
    # A door's broker calls are chains of small requests: Nagle's algorithm would hold each for the previous one's ACK.
    client = {"socket.nagle.disable": True, **(client_config or {}), "bootstrap.servers": bootstrap_servers}
    consumer = {
        # A member killed without leaving holds its partitions this long: 10 s rather than 45 s.
        "session.timeout.ms": 10_000,
        **client, "group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }  # fmt: skip
    return client, consumer


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

    async def outputs(self, messages: list[Message], on_chunk: Callable[[list[Message], list[Output]], None] | None = None) -> list[Output]:
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
                    record = await self.scorer.score(request, trace)
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
            log.info("request %s %.2f ms dead-lettered (%s) from %s%s", request_id, (time.perf_counter() - began) * 1000, reason,
                     where, log_suffix(trace))  # fmt: skip
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
                output.trace.stage("log_prediction", output.made_at, at, kind="PRODUCER",
                                   **{"messaging.destination.name": output.topic, "loopline.kafka_delivery": delivery})  # fmt: skip
                self.tracer.finish(output.trace, f"score {self.requests_topic}", "CONSUMER", at, error=output.error,
                                   **{"loopline.request_id": output.key or "-", "messaging.system": "kafka"})  # fmt: skip


def _header(message: Message, name: str) -> bytes | None:
    """The value of a record's header ``name`` (the last, if repeated), or None."""
    found = None
    for key, value in message.headers() or ():
        if key == name:
            found = value
    return found


def _dead_letter(message: Message, reason: str, error: str, field: str | None) -> bytes:
    return encode(DeadLetterRecord.for_payload(
        reason=reason, error=error, error_field=field, source_topic=message.topic(),
        source_partition=message.partition(), source_offset=message.offset(), key=message.key(),
        payload=message.value(), consumer=CONSUMER_NAME,
    ))  # fmt: skip


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
