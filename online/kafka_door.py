"""The Kafka front door: ``scoring.requests`` → scorer → ``scoring.predictions``, exactly once.

Each polled batch of requests is scored concurrently (so the dynamic batcher fills), and each chunk of it, once
scored, is handed to the door's :class:`~online.kafka_transactions.TransactionWriter`: its prediction records, its
dead letters and the offsets just past its requests are committed in one Kafka transaction, which closes
``commit_interval_s`` after its first chunk (see that module). A request that fails for any reason is dead-lettered
with the reason (never retried forever, never allowed to stop the door), except while the scorer is merely busy or
not ready, which is waited out. A consumer killed mid-batch leaves an aborted transaction: its records are never
visible to ``read_committed`` readers, and its requests are consumed again from the last committed offsets. So
every request yields exactly one record, and none is lost.

Every broker call runs off the event loop, on the door's own threads, with a timeout. When a transaction fails
(a retriable error is retried; an abortable one aborts it; any other re-creates the producer, fencing its
predecessor's transaction), the door rewinds to the last committed offsets. Before this member gives up
partitions in a rebalance it commits what it has scored, so the next owner starts exactly where this one stopped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message

from online.doors import Progress
from online.kafka_scoring import DOOR, Output, Partition, RequestScoring, door_consumer_settings, take
from online.kafka_transactions import TransactionWriter, transactional_producer_config

log = logging.getLogger(__name__)


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
        commit_interval_s: float = 0.05,
        max_transaction_records: int = 1000,
    ) -> None:
        """Consumes ``scoring.requests_topic`` up to ``max_poll_records`` a poll; a transaction commits
        ``commit_interval_s`` after its first scored chunk was handed over, or at ``max_transaction_records``."""
        self.scoring, self.scorer, self.requests_topic = scoring, scoring.scorer, scoring.requests_topic
        self.max_poll_records, self.broker_timeout_s = max_poll_records, broker_timeout_s
        self._consumer_config = door_consumer_settings(bootstrap_servers, client_config, group_id)
        self._consumer = Consumer(self._consumer_config)
        self._poller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-poll")
        self._stopping = threading.Event()
        self._progress = Progress()
        self._writer = TransactionWriter(
            transactional_producer_config(
                bootstrap_servers,
                client_config,
                transactional_id,
                interval_s=commit_interval_s,
                broker_timeout_s=broker_timeout_s,
            ),
            interval_s=commit_interval_s,
            max_records=max_transaction_records,
            broker_timeout_s=broker_timeout_s,
            committed=self._committed,
            stopping=self._stopping,
        )
        #: Requests of a transaction that did not commit are owed until a later one commits: an idle poll
        #: meanwhile is no progress (the consumer may be unable to fetch them again).
        self._owed = False
        #: A polled batch is being scored (not all of it handed to the writer yet): a commit meanwhile still leaves
        #: the door holding requests, so a batch whose scoring hangs shows as a stall.
        self._scoring = False

    def stalled_s(self) -> float:
        """Seconds this door has held polled requests without committing any."""
        return self._progress.stalled_s()

    def _committed(self, outputs: list[Output], at: float) -> None:
        """The writer committed ``outputs`` (on its thread)."""
        self._owed = False
        self._progress.progressed(still_holding=self._scoring or self._writer.pending > 0)
        self.scoring.logged(outputs, at, "exactly_once")

    # Consumer calls (on the poller thread) --------------------------------------------------------

    def _take(self) -> tuple[list[Message], object, bool]:
        """:func:`take`, with the consumer group's metadata as of this poll (a transaction for a batch polled in
        an older generation is refused by the broker)."""
        messages, waiting = take(self._consumer, self.max_poll_records)
        return messages, self._consumer.consumer_group_metadata(), waiting

    def _rewind_if_failed(self) -> bool:
        """If a transaction failed (or is overdue, and so abandoned), seek back to the committed offsets and take
        chunks again; whether it did."""
        if not (self._writer.abandon_if_overdue() or self._writer.failed):
            return False
        self._owed = True
        self._rewind()
        self._writer.reopen()
        return True

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
        self._subscribe()

    def _subscribe(self) -> None:
        # Before partitions move to another member, what was scored from them is committed.
        self._consumer.subscribe([self.requests_topic], on_revoke=lambda *_: self._writer.settle())

    def _hand(self, group_metadata: object, messages: list[Message], outputs: list[Output]) -> None:
        """Give the writer a scored chunk: its records, and per partition the offset just past its last request."""
        ends: dict[Partition, int] = {}
        for m in messages:
            ends[m.topic(), m.partition()] = max(ends.get((m.topic(), m.partition()), -1), m.offset() + 1)
        self._writer.hand(outputs, ends, group_metadata)

    # The loop ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, score and log transactionally until ``stop`` is set; joins the group once a model is ready."""
        loop = asyncio.get_running_loop()
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._stopping.set())
        on_poller = lambda call, *args: loop.run_in_executor(self._poller, call, *args)  # noqa: E731
        try:
            if not await on_poller(self._writer.start):
                return
            ready = asyncio.ensure_future(self.scorer.wait_ready())
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            self._subscribe()
            while not stop.is_set():
                messages, group_metadata, waiting = await on_poller(self._take)
                if await on_poller(self._rewind_if_failed):
                    continue  # what was just polled comes again after the rewound requests
                if not messages:
                    if waiting or self._owed or self._writer.pending:
                        self._progress.holding()
                    else:
                        self._progress.progressed(still_holding=False)
                    continue
                self._progress.holding()
                self._scoring = True
                try:
                    await self.scoring.outputs(messages, on_chunk=functools.partial(self._hand, group_metadata))
                finally:
                    self._scoring = False
                while not stop.is_set() and not await on_poller(self._writer.wait_for_room, 0.5):
                    await on_poller(self._rewind_if_failed)
            await on_poller(self._writer.settle)
        finally:
            stopping.cancel()
            self._stopping.set()
            self._writer.close()
            await loop.run_in_executor(self._poller, self._consumer.close)
            self._poller.shutdown(wait=False)
