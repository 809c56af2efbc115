"""The exactly-once Kafka door's transactions, committed by time rather than once per poll.

The door hands over each chunk of requests as soon as it is scored: the chunk's records and the offsets just past
its requests. A writer thread produces them into the open transaction at once, and commits the transaction (its
records, then the group's offsets) ``interval_s`` after its first chunk was handed over, at ``max_records``, or as
soon as the door asks it to settle (before giving up partitions, at shutdown). Chunks handed over while it commits
go into the next transaction, which begins once this one is settled. So a scored request waits for about one
interval and one commit (two commits when a commit outlasts the interval), the door never waits for a commit before
polling again, and the broker writes one set of transaction markers per interval, however often the door polls.

A transaction that fails is aborted (or its producer replaced, which fences it), and every chunk handed over since
the last commit is dropped until the door has rewound its consumer to the committed offsets and called
:meth:`TransactionWriter.reopen`: those requests are consumed again, and none is logged twice. A transaction that
has not settled within its interval plus ``1.5 × broker_timeout_s`` of its beginning when the door next looks (after
each poll, and every half second while it waits for room; librdkafka's ``send_offsets_to_transaction`` can block past
its timeout when the group coordinator goes away: librdkafka issues 5456, 5511) is abandoned the same way: its
producer is replaced, and its thread is left to return whenever it does. A writer thread that ended on an error that
is not Kafka's is replaced when the door reopens.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from online.kafka_scoring import DOOR_CLIENT_DEFAULTS, Output, Partition
from schemas.kafka_config import transactional_producer_settings

log = logging.getLogger(__name__)
#: Pause between tries of a broker call that failed with a retriable error.
_RETRY_PAUSE_S = 0.5
#: A transaction not settled within its interval plus this many broker timeouts is abandoned (a broker call that keeps
#: its timeout fails within one; a second call retried after it may be cut short).
_SETTLE_FACTOR = 1.5
#: A transaction begun just after the last one committed finds its markers still being written: the coordinator answers
#: CONCURRENT_TRANSACTIONS and the client retries after ``retry.backoff.ms``, 100 ms by default in librdkafka, so every
#: back-to-back transaction took 105 ms p50 here (``send_offsets_to_transaction`` alone 104 ms;
#: benchmarks/kafka_transactions.py). The Java client retries that answer to AddPartitionsToTxn after 20 ms
#: (KAFKA-5477); librdkafka has no such special case, so the door lowers the first backoff of every retried request of
#: this producer to 20 ms: 28 ms p50 a transaction. The backoff still grows exponentially (``retry.backoff.max.ms``)
#: when a broker is away. A client_config that sets it wins (it is a default).
TRANSACTION_RETRY_BACKOFF = {"retry.backoff.ms": 20}
T = TypeVar("T")


class Chunk(NamedTuple):
    """Scored requests to log in one transaction: their records, and per partition the offset to resume from."""

    outputs: list[Output]
    offsets: dict[Partition, int]
    group_metadata: object
    handed_at: float  # time.monotonic()


def transactional_producer_config(
    bootstrap_servers: str,
    client_config: Mapping[str, str] | None,
    transactional_id: str,
    *,
    interval_s: float,
    broker_timeout_s: float,
) -> dict[str, object]:
    """The door's producer settings: a transactional producer as ``transactional_id``, with the door clients' defaults,
    :data:`TRANSACTION_RETRY_BACKOFF` and :func:`transaction_timeout_ms` beneath the user's ``client_config``."""
    defaults = {
        **DOOR_CLIENT_DEFAULTS,
        **TRANSACTION_RETRY_BACKOFF,
        "transaction.timeout.ms": transaction_timeout_ms(interval_s, broker_timeout_s),
    }
    return transactional_producer_settings(bootstrap_servers, client_config, transactional_id, defaults)


def transaction_timeout_ms(interval_s: float, broker_timeout_s: float) -> int:
    """How long the broker lets one of the door's transactions stay open before aborting it: the longest a writer with
    ``interval_s`` keeps one before abandoning it (its settle bound) and one broker call more, so a transaction the
    writer still settles is never aborted under it. A door that crashed mid-transaction holds read_committed readers of
    its partitions this long at most (librdkafka's default: a minute); a successor with its transactional id (the
    chart's StatefulSet pod of the same ordinal) fences it at once, when it initialises its transactions."""
    return math.ceil((interval_s + (_SETTLE_FACTOR + 1) * broker_timeout_s) * 1000)


class TransactionWriter:
    """Commits the chunks handed to it in transactions of one producer, by time; see the module's docstring."""

    def __init__(
        self,
        producer_config: Mapping[str, object],
        *,
        interval_s: float,
        max_records: int,
        broker_timeout_s: float,
        committed: Callable[[list[Output], float], None],
        stopping: threading.Event,
    ) -> None:
        """``committed(outputs, at)`` is called (on the writer's thread) once a transaction's records are readable."""
        self._config, self.interval_s, self.max_records = dict(producer_config), interval_s, max_records
        self.broker_timeout_s, self._committed, self._stopping = broker_timeout_s, committed, stopping
        self._settle_s = interval_s + _SETTLE_FACTOR * broker_timeout_s
        self._changed = threading.Condition()
        self._abandoning = threading.Lock()  # one abandon at a time: the poller and a rebalance's settle may both try
        # Guarded by _changed:
        self._queue: list[Chunk] = []
        self._pending = 0  # records handed over and neither committed nor dropped
        self._open_since: float | None = None  # when the transaction in flight began
        self._failed = False
        self._hurry = False
        self._closing = False
        self._running = False  # a writer thread is there to take chunks (none once the door stopped)
        self._generation = 0  # bumped when a writer thread is abandoned: the old one, if it returns, stops

    @property
    def pending(self) -> int:
        """Records handed over and not yet committed (nor dropped after a failure)."""
        with self._changed:
            return self._pending

    @property
    def failed(self) -> bool:
        """Whether a transaction failed (or was abandoned) since the last :meth:`reopen`."""
        with self._changed:
            return self._failed

    def start(self) -> bool:
        """Make the producer (fencing any predecessor's open transaction) and start writing; False if the door
        stopped before the broker answered. Blocks."""
        return self._restart(self._generation_now())

    def hand(self, outputs: list[Output], offsets: dict[Partition, int], group_metadata: object) -> None:
        """Log ``outputs`` and commit ``offsets`` (the group's, as of ``group_metadata``) in a coming transaction;
        dropped if one has failed since the last :meth:`reopen`."""
        with self._changed:
            if self._failed or not self._running:  # consumed again after the rewind (or by the next member)
                return
            self._queue.append(Chunk(outputs, offsets, group_metadata, time.monotonic()))
            self._pending += len(outputs)
            self._changed.notify_all()

    def reopen(self) -> None:
        """The door has rewound to the committed offsets: take chunks again, with a new writer thread (and producer)
        if the last one ended on an error. Blocks while a new producer starts."""
        with self._changed:
            self._failed = False
            respawn = not self._running and not self._closing and not self._stopping.is_set()
        if respawn:
            with self._abandoning:  # an abandon may have started one meanwhile
                if not self._running_now():
                    self._restart(self._generation_now())

    def wait_for_room(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until fewer than two transactions' worth of records are pending; whether so."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending < 2 * self.max_records or self._failed, timeout_s)

    def settle(self) -> bool:
        """Commit what was handed over now, and wait until it is settled; whether everything committed. A
        transaction that does not settle in time is abandoned (see the module's docstring)."""
        with self._changed:
            self._hurry = True
            self._changed.notify_all()
            settled = self._changed.wait_for(lambda: self._pending == 0 or not self._running, self._settle_s)
            self._hurry = False
            failed = self._failed or self._pending > 0
        if not settled:
            self._abandon()
        return settled and not failed

    def abandon_if_overdue(self) -> bool:
        """Abandon the transaction in flight if it has not settled in time; whether it was. Blocks while the new
        producer starts."""
        with self._changed:
            overdue = self._open_since is not None and time.monotonic() - self._open_since > self._settle_s
        if overdue:
            self._abandon()
        return overdue

    def close(self) -> None:
        """Let the writer's thread end once what was handed over is settled."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()

    # The writer's thread -----------------------------------------------------------------------------

    def _generation_now(self) -> int:
        with self._changed:
            return self._generation

    def _running_now(self) -> bool:
        with self._changed:
            return self._running

    def _restart(self, generation: int) -> bool:
        """A new producer and a writer thread of ``generation`` (unless a later abandon has moved on); whether one
        started."""
        producer = self._new_producer()
        if producer is None:
            return False
        with self._changed:
            if generation != self._generation:
                return False
            self._running = True
        threading.Thread(target=self._write, args=(producer, generation), name="kafka-txn", daemon=True).start()
        return True

    def _write(self, producer: Producer, generation: int) -> None:
        """Transactions, one after another, while there are chunks to log (and the door has not stopped)."""
        current: Producer | None = producer
        try:
            while current is not None:
                with self._changed:
                    self._changed.wait_for(lambda: self._queue or self._closing or generation != self._generation)
                    if generation != self._generation or not self._queue:
                        break
                current = self._transact(current, generation)
        finally:
            with self._changed:
                if generation == self._generation:
                    # Ended by an error (mid-transaction, or before the door closed): drop what it held, so that the
                    # door rewinds, and reopening starts a new thread.
                    ended_early = not (self._closing or self._stopping.is_set())
                    if self._queue or self._open_since is not None or ended_early:
                        self._failed, self._queue, self._pending, self._open_since = True, [], 0, None
                    self._running = False
                    self._changed.notify_all()

    def _transact(self, producer: Producer, generation: int) -> Producer | None:
        """One transaction of the chunks queued now and those arriving within its interval; the producer to go on
        with (a new one if this one had to be replaced), or None if this thread was abandoned or the door stopped."""
        included: list[Chunk] = []
        try:
            began = time.monotonic()
            with self._changed:
                self._open_since = began
            producer.begin_transaction()
            records, deadline = 0, began + self.interval_s  # until its first chunk is taken
            while True:
                with self._changed:
                    self._changed.wait_for(
                        lambda: self._queue or self._hurry or generation != self._generation,
                        max(0.0, deadline - time.monotonic()),
                    )
                    if generation != self._generation:
                        return None
                    taken, self._queue, hurry = self._queue, [], self._hurry
                if taken and not included:  # the interval runs from when the first chunk was handed over
                    deadline = taken[0].handed_at + self.interval_s
                included += taken
                for chunk in taken:
                    for output in chunk.outputs:
                        self._produce(producer, output)
                    records += len(chunk.outputs)
                if hurry or records >= self.max_records or time.monotonic() >= deadline:
                    break
            if not included:  # the queue was dropped while this waited: nothing to commit
                producer.abort_transaction(self.broker_timeout_s)
                with self._changed:
                    self._open_since = None
                return producer if generation == self._generation else None
            offsets: dict[Partition, int] = {}
            for chunk in included:  # chunks come in poll order: a later one's offset is further on
                offsets.update(chunk.offsets)
            partitions = [TopicPartition(topic, number, offset) for (topic, number), offset in offsets.items()]
            self._retrying(producer.send_offsets_to_transaction, partitions, included[-1].group_metadata, self.broker_timeout_s)
            self._retrying(producer.commit_transaction, self.broker_timeout_s)
        except KafkaException as exc:
            if not self._fail(generation, sum(len(chunk.outputs) for chunk in included)):
                return None
            return self._recover(producer, exc.args[0])
        except Exception:  # not Kafka's (a bug): fail as if it were, with a new producer fencing this one's transaction
            log.exception("Kafka transaction failed")
            return self._new_producer() if self._fail(generation, sum(len(chunk.outputs) for chunk in included)) else None
        outputs = [output for chunk in included for output in chunk.outputs]
        with self._changed:
            if generation != self._generation:  # abandoned meanwhile: its accounting was reset
                return None
            self._pending -= len(outputs)
            self._open_since = None
            self._changed.notify_all()
        try:
            self._committed(outputs, time.perf_counter())
        except Exception:  # the door's bookkeeping (metrics, traces) must not end the writer
            log.exception("after a Kafka transaction committed")
        return producer

    @staticmethod
    def _produce(producer: Producer, output: Output) -> None:
        while True:
            try:
                producer.produce(output.topic, output.value, output.key, headers=output.headers)
                return
            except BufferError:  # the queue is full while the broker is slow: make room
                producer.poll(0.1)

    def _fail(self, generation: int, included: int) -> bool:
        """A transaction of ``included`` records failed: drop it and everything queued behind it; False (and nothing
        dropped) if the thread of ``generation`` was abandoned meanwhile."""
        log.warning("Kafka transaction failed; its requests and those scored since will be consumed again")
        with self._changed:
            if generation != self._generation:
                return False
            self._failed = True
            self._pending -= included + sum(len(chunk.outputs) for chunk in self._queue)
            self._queue, self._open_since = [], None
            self._changed.notify_all()
        return True

    def _abandon(self) -> None:
        """Give up on the writer's thread (blocked in librdkafka): fence its transaction with a new producer."""
        with self._abandoning:
            log.error(
                "Kafka transaction not settled after %.0f s (a broker call ignored its timeout); abandoning its "
                "producer, its requests will be consumed again",
                self._settle_s,
            )
            with self._changed:
                self._generation += 1
                generation = self._generation
                self._failed, self._queue, self._pending, self._open_since, self._running = True, [], 0, None, False
                self._changed.notify_all()
            self._restart(generation)

    # Broker calls ------------------------------------------------------------------------------------

    def _retrying(self, call: Callable[..., T], *args: object) -> T:
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
        """A transactional producer, its transactions initialised (fencing any predecessor's); None if the door
        stopped before the broker answered."""
        while not self._stopping.is_set():
            producer = Producer(self._config)
            try:
                self._retrying(producer.init_transactions, self.broker_timeout_s)
                return producer
            except KafkaException as exc:
                log.warning("Kafka init_transactions: %s; trying a new producer", exc.args[0].str())
                time.sleep(_RETRY_PAUSE_S)
        return None

    def _recover(self, producer: Producer, error: KafkaError) -> Producer | None:
        """After a failed transaction: abort it when the broker allows, else go on with a new producer."""
        log.warning("Kafka transaction: %s", error.str())
        if error.txn_requires_abort():
            try:
                self._retrying(producer.abort_transaction, self.broker_timeout_s)
                return producer
            except KafkaException as exc:
                log.warning("Kafka abort_transaction: %s", exc.args[0].str())
        return self._new_producer()
