"""The Kafka front door: ``scoring.requests`` → scorer → ``scoring.predictions``, exactly once.

Each polled batch of requests is scored concurrently (so the dynamic batcher fills), then its
prediction records, any dead letters (requests that break the contract) and the offsets just past
the batch are committed in one Kafka transaction. A consumer killed mid-batch leaves an aborted
transaction: its predictions are never visible to ``read_committed`` readers, and its requests
are consumed again from the last committed offsets. So every request yields exactly one
prediction record in the log, and none is lost.

The commit of one batch overlaps the scoring of the next (a transaction commit is a broker round
trip the scorer would otherwise sit out); the next transaction begins only once the previous one
is committed. Before this member gives up partitions in a rebalance it waits for that commit, so
the next owner starts exactly where this one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from online.batcher import Overloaded
from online.scorer import RequestError, Scorer
from schemas.records import DeadLetterRecord, ScoreRequest
from schemas.validation import ContractViolation, decode, encode

log = logging.getLogger("loopline.scoring")
DOOR = "kafka"


class KafkaScoringDoor:
    """Consumes score requests as one member of ``group_id`` and logs a prediction for each."""

    def __init__(
        self,
        scorer: Scorer,
        bootstrap_servers: str,
        group_id: str,
        requests_topic: str,
        predictions_topic: str,
        dead_letter_topic: str,
        transactional_id: str,
        max_poll_records: int = 256,
    ) -> None:
        self.scorer = scorer
        self.topics = (requests_topic, predictions_topic, dead_letter_topic)
        self.max_poll_records = max_poll_records
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        })  # fmt: skip
        # A restarted member with the same transactional id fences off its predecessor's open transaction.
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id})
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txn-commit")
        self._committing: Future | None = None

    async def _score_one(self, message: Message) -> tuple[str, bytes, str]:
        """The record to log for one request, (topic, value, key): its prediction, or a dead letter."""
        began = time.perf_counter()
        try:
            request = decode(ScoreRequest, message.value() or b"")
            while True:
                try:
                    record = await self.scorer.score(request)
                    break
                except Overloaded:  # the batch is ours to finish: wait for room rather than drop it
                    await asyncio.sleep(0.005)
        except (ContractViolation, RequestError) as err:
            letter = DeadLetterRecord.for_payload(
                reason="invalid", error=str(err), error_field=err.field, source_topic=message.topic(),
                source_partition=message.partition(), source_offset=message.offset(), key=message.key(),
                payload=message.value(), consumer=f"loopline-scorer/{DOOR}",
            )  # fmt: skip
            self.scorer.metrics.requests.labels(DOOR, "invalid").inc()
            return self.topics[2], encode(letter), message.topic()
        self.scorer.metrics.requests.labels(DOOR, "200").inc()
        log.info("request %s %.2f ms ok", request.request_id, (time.perf_counter() - began) * 1000)
        return self.topics[1], encode(record), request.request_id

    def _take(self) -> list[Message]:
        """Wait (briefly) for a request, then take what else has already arrived, up to max_poll_records.

        Waiting to fill a whole batch would add its wait to every request's latency; under load the
        batches fill by themselves while the previous one is scored and committed.
        """
        first = self._consumer.poll(0.1)
        if first is None:
            return []
        return [first, *self._consumer.consume(self.max_poll_records - 1, 0)]

    def _finish_commit(self, *_) -> None:
        """Wait for the transaction being committed, if any (also the consumer's on_revoke: before
        partitions move to another member, their offsets are committed)."""
        if self._committing is not None:
            self._committing.result()
            self._committing = None

    @staticmethod
    def _next_offsets(messages: list[Message]) -> list[TopicPartition]:
        """Per partition in ``messages``, the offset just past the last one: where to resume."""
        ends: dict[tuple[str, int], int] = {}
        for m in messages:
            ends[m.topic(), m.partition()] = max(ends.get((m.topic(), m.partition()), -1), m.offset() + 1)
        return [TopicPartition(topic, partition, offset) for (topic, partition), offset in ends.items()]

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, score and log transactionally until ``stop`` is set; joins the group once a model is ready."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._producer.init_transactions)
        ready, stopped = asyncio.ensure_future(self.scorer.wait_ready()), asyncio.ensure_future(stop.wait())
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        for waiter in (ready, stopped):
            waiter.cancel()
        self._consumer.subscribe([self.topics[0]], on_revoke=self._finish_commit)
        try:
            while not stop.is_set():
                messages = [m for m in await loop.run_in_executor(None, self._take) if m.error() is None]
                if not messages:
                    await loop.run_in_executor(None, self._finish_commit)
                    continue
                outputs = await asyncio.gather(*(self._score_one(m) for m in messages))
                await loop.run_in_executor(None, self._finish_commit)
                self._producer.begin_transaction()
                for topic, value, key in outputs:
                    self._producer.produce(topic, value, key)
                self._producer.send_offsets_to_transaction(self._next_offsets(messages), self._consumer.consumer_group_metadata())
                self._committing = self._committer.submit(self._producer.commit_transaction)
            await loop.run_in_executor(None, self._finish_commit)
        finally:
            self._consumer.close()
            self._committer.shutdown(wait=True)
