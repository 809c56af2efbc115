"""The Kafka front door at least once (``serving.kafka_delivery: at_least_once``): each prediction out once scored.

The exactly-once door (``online/kafka_door.py``) holds each request's prediction until its batch's transaction
commits. This one sends each prediction as soon as it is scored, through an idempotent producer (no duplicate
from the producer's own retries), and commits a partition's offset only past requests whose records the broker
has acknowledged, every ``commit_interval_s``. So nothing is lost: a request is either acknowledged or consumed
again. What a crash can do is score a request twice (those acknowledged since the last commit); every reader
downstream counts a request once by its request id (the joiner joins it once, the monitor counts it once).

A record Kafka refuses for good (after the producer's own retries) is sent again; a record the producer has no
room for waits off the event loop until it has. While the broker is away the door stops taking requests once
``max_unacknowledged`` are waiting. Before this member gives up partitions in a rebalance it waits (up to
``broker_timeout_s``) for every record sent to be acknowledged, those waiting for room too, and commits them, so
the next owner starts past them. If the producer fails outright (a record it refuses to take), the door stops.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from online.doors import Progress
from online.kafka_scoring import DOOR, DOOR_CLIENT_DEFAULTS, Output, Partition, RequestScoring, door_consumer_settings, take
from schemas.kafka_config import producer_settings

log = logging.getLogger(__name__)


class Acknowledgements:
    """Per partition, the offsets taken whose records the broker has not acknowledged yet, and how far is safe
    to commit: up to the oldest such offset, or past the last one taken. Thread-safe (acknowledgements arrive
    on the producer's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Partition, set[int]] = {}
        self._next: dict[Partition, int] = {}

    def taken(self, partition: Partition, offset: int) -> None:
        with self._lock:
            self._pending.setdefault(partition, set()).add(offset)
            self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def acknowledged(self, partition: Partition, offset: int) -> None:
        with self._lock:
            self._pending.get(partition, set()).discard(offset)

    @property
    def waiting(self) -> int:
        """Records sent and not acknowledged yet."""
        with self._lock:
            return sum(map(len, self._pending.values()))

    def committable(self, partitions: list[Partition] | None = None) -> list[TopicPartition]:
        """The offsets safe to commit, of ``partitions`` (default: every one taken from)."""
        with self._lock:
            chosen = self._next if partitions is None else [p for p in partitions if p in self._next]
            return [
                TopicPartition(topic, number, min(self._pending[(topic, number)], default=self._next[(topic, number)]))
                for topic, number in chosen
            ]

    def forget(self, partitions: list[Partition]) -> None:
        """Partitions this member no longer owns."""
        with self._lock:
            for partition in partitions:
                self._pending.pop(partition, None)
                self._next.pop(partition, None)


class AtLeastOnceKafkaDoor:
    """Consumes score requests as one member of ``group_id`` and logs at least one record for each, at once."""

    name = DOOR

    def __init__(
        self,
        scoring: RequestScoring,
        *,
        bootstrap_servers: str,
        group_id: str,
        client_config: Mapping[str, str] | None = None,
        max_poll_records: int = 256,
        commit_interval_s: float = 0.05,
        max_unacknowledged: int = 10_000,
        broker_timeout_s: float = 10.0,
    ) -> None:
        """Consumes ``scoring.requests_topic``."""
        self.scoring, self.scorer, self.requests_topic = scoring, scoring.scorer, scoring.requests_topic
        self.max_poll_records = max_poll_records
        self.commit_interval_s, self.max_unacknowledged, self.broker_timeout_s = (
            commit_interval_s,
            max_unacknowledged,
            broker_timeout_s,
        )
        self._consumer = Consumer(door_consumer_settings(bootstrap_servers, client_config, group_id))
        # Each record goes within a millisecond: the latency is the point of this mode.
        defaults = {**DOOR_CLIENT_DEFAULTS, "linger.ms": 1, "compression.type": "lz4"}
        self._producer = Producer(producer_settings(bootstrap_servers, client_config, defaults))
        self._acks = Acknowledgements()
        # Only the acknowledging thread takes from the left (so no record is handed over twice or dropped); appends
        # come from the event loop and from whichever thread serves a delivery report.
        self._unsent: deque[tuple[Output, Partition, int]] = deque()
        self._producer_failed: Exception | None = None
        self._consumer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-poll")
        self._stopping = threading.Event()
        self._progress = Progress()

    def stalled_s(self) -> float:
        """Seconds this door has held requests without any of their records being acknowledged."""
        return self._progress.stalled_s()

    # The producer's side (sends from the event loop, deferred sends and acknowledgements on the acknowledging thread)

    def _send(self, output: Output, partition: Partition, offset: int) -> None:
        """Hand a record to the producer, without waiting: one it has no room for (the broker is slow) waits in
        ``_unsent``, behind any already there, for the acknowledging thread to hand over."""
        if self._unsent or not self._produce(output, partition, offset):
            self._unsent.append((output, partition, offset))

    def _send_all(self, messages: list[Message], outputs: list[Output]) -> None:
        for message, output in zip(messages, outputs, strict=True):
            self._send(output, (message.topic(), message.partition()), message.offset())

    def _produce(self, output: Output, partition: Partition, offset: int) -> bool:
        try:
            self._producer.produce(
                output.topic,
                output.value,
                output.key,
                headers=output.headers,
                on_delivery=lambda err, _msg: self._delivered(err, output, partition, offset),
            )
        except BufferError:
            return False
        return True

    def _delivered(self, err: KafkaError | None, output: Output, partition: Partition, offset: int) -> None:
        if err is None:
            self._acks.acknowledged(partition, offset)
            self._progress.progressed(still_holding=self._acks.waiting > 0)
            if output.trace is not None:
                self.scoring.logged([output], time.perf_counter(), "at_least_once")
            return
        log.warning("Kafka refused the record of %s[%d]@%d (%s); sending it again", *partition, offset, err.str())
        self._unsent.append((output, partition, offset))

    def _serve_acknowledgements(self) -> None:
        try:
            while not self._stopping.is_set():
                self._producer.poll(0.05)
                while self._unsent and self._produce(*self._unsent[0]):
                    self._unsent.popleft()
        except Exception as exc:  # a record the producer refuses outright, a fatal producer error: the door stops on it
            log.exception("the at-least-once door's producer failed")
            self._producer_failed = exc

    def _drain(self, timeout_s: float) -> int:
        """Wait until every record sent, those waiting for room too, is acknowledged, or ``timeout_s`` has passed; how
        many are not (the acknowledging thread must still run, to hand over those waiting)."""
        deadline = time.monotonic() + timeout_s
        while (self._unsent or len(self._producer)) and time.monotonic() < deadline and self._producer_failed is None:
            self._producer.flush(0.1)
        return len(self._unsent) + len(self._producer)

    # The consumer's side (its own thread) ----------------------------------------------------------

    def _commit(self, partitions: list[Partition] | None = None, wait: bool = False) -> None:
        offsets = self._acks.committable(partitions)
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=not wait)
        except KafkaException as exc:  # e.g. a rebalance under way: the next commit covers these offsets too
            log.warning("Kafka commit: %s", exc.args[0].str())

    def _on_revoke(self, _consumer: Consumer, revoked: list[TopicPartition]) -> None:
        """Before partitions move: their records acknowledged, their offsets committed."""
        partitions = [(p.topic, p.partition) for p in revoked]
        left = self._drain(self.broker_timeout_s)
        if left:
            log.error("%d records not acknowledged before a rebalance: their requests will be scored again", left)
        self._commit(partitions, wait=True)
        self._acks.forget(partitions)

    # The loop ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, score and log until ``stop`` is set; joins the group once a model is ready."""
        loop = asyncio.get_running_loop()
        acknowledging = threading.Thread(target=self._serve_acknowledgements, name="kafka-acks", daemon=True)
        acknowledging.start()
        stopping = asyncio.ensure_future(stop.wait())
        try:
            ready = asyncio.ensure_future(self.scorer.wait_ready())
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            self._consumer.subscribe([self.requests_topic], on_revoke=self._on_revoke)
            committed_at = time.monotonic()
            while not stop.is_set():
                if self._producer_failed is not None:
                    raise RuntimeError("the at-least-once door's producer failed") from self._producer_failed
                if self._acks.waiting >= self.max_unacknowledged:  # the broker is away: take no more for now
                    self._progress.holding()
                    await asyncio.sleep(0.05)
                    continue
                messages, waiting = await loop.run_in_executor(self._consumer_thread, take, self._consumer, self.max_poll_records)
                if messages:
                    self._progress.holding()
                    for message in messages:
                        self._acks.taken((message.topic(), message.partition()), message.offset())
                    await self.scoring.outputs(messages, on_chunk=self._send_all)
                elif waiting:
                    self._progress.holding()
                elif not self._acks.waiting:
                    self._progress.progressed(still_holding=False)
                if time.monotonic() - committed_at >= self.commit_interval_s:
                    committed_at = time.monotonic()
                    await loop.run_in_executor(self._consumer_thread, self._commit)
        finally:
            stopping.cancel()
            left = await loop.run_in_executor(self._consumer_thread, self._drain, self.broker_timeout_s)
            if left:
                log.error("%d records not acknowledged at shutdown: their requests will be scored again", left)
            try:
                await loop.run_in_executor(self._consumer_thread, lambda: (self._commit(wait=True), self._consumer.close()))
            finally:
                self._stopping.set()
                self._consumer_thread.shutdown(wait=False)
