"""The skew and consistency monitor (`loopline monitor`): a faust-streaming app over ``scoring.predictions``.

* An agent reads the prediction log read_committed (an aborted scoring transaction is never counted) and adds each
  record's feature values to a sliding window of counts (``feature_log.py``) kept in a faust table, changelogged to
  Kafka: a restarted monitor recovers its window from the changelog. It runs at least once, not under faust's
  exactly-once guarantee, whose transactional producer crashed under the demo's load ("Can't send messages while
  not in transaction" after its buffer filled); a record re-read after a restart is not counted twice, since each
  bucket keeps the last offset it counted. A request logged twice (an at-least-once scorer that crashed scores again
  what it had not committed, ``online/kafka_door_at_least_once.py``) is counted once, by its request id
  (``request_dedup.py``).
* A record that does not decode, or that the window cannot count (``feature_log.py`` says which: a string where a
  number goes, ±Infinity or an integer beyond a double, an empty feature vector), is counted in
  ``loopline_monitor_bad_records_total`` by reason and left out of the window and the consistency sample; the agent
  goes on with the next record.
* A timer measures skew over the window against the reference (``drift.py``) and exports it.
* Requests whose entity key falls in the sample are held, and replayed against the offline recompute of the
  raw event log (``consistency.py``) once they settled; the ratios of the last replay are exported.

The app takes plain values and callables; ``loopline/`` reads the settings and wires the model registry, the snapshot
store and the event log in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer

from feedback_loop.consistency import FeatureConsistency, sampled
from feedback_loop.drift import SkewThresholds
from feedback_loop.feature_log import FeatureLogWindow
from feedback_loop.monitor_metrics import CONTRACT_VIOLATION, MonitorMetrics
from feedback_loop.reference import FeatureReference
from feedback_loop.request_dedup import RecentRequests
from schemas.records import PredictionRecord
from schemas.validation import ContractViolation, decode

log = logging.getLogger(__name__)
#: (reference id, feature → reference): what skew is measured against now.
References = tuple[str, Mapping[str, FeatureReference]]


@dataclass(frozen=True)
class MonitorConfig:
    """Where the monitor reads and what it keeps (plain values; ``loopline/`` fills them from settings)."""

    bootstrap_servers: str
    predictions_topic: str
    #: The predictions topic's partition count: the window table is partitioned the same way.
    partitions: int
    app_id: str
    #: Where faust keeps its local files (its default is the working directory).
    data_dir: Path
    window_ms: int
    bucket_ms: int
    check_interval_s: float
    min_rows: int
    thresholds: SkewThresholds
    feature_thresholds: Mapping[str, SkewThresholds]
    sample_rate: float
    consistency_interval_s: float
    settle_ms: int
    max_sampled: int
    from_earliest: bool
    shutdown_timeout_s: float = 10.0


class Monitor:
    """The faust app and the state its agent and timers share."""

    def __init__(
        self,
        config: MonitorConfig,
        references: Callable[[], References],
        replay: Callable[[list[PredictionRecord]], Mapping[str, FeatureConsistency]] | None,
        metrics: MonitorMetrics,
    ) -> None:
        """``references`` is asked (off the event loop) at start and before each check; ``replay`` checks a batch of
        settled sampled requests against the recompute (None: no consistency replay)."""
        self.config, self.references, self.replay, self.metrics = config, references, replay, metrics
        self.app = faust.App(
            config.app_id,
            broker=f"kafka://{config.bootstrap_servers}",
            store="memory://",
            web_enabled=False,
            datadir=config.data_dir,
            processing_guarantee="at_least_once",
            topic_partitions=config.partitions,
            broker_client_id=config.app_id,
            consumer_auto_offset_reset="earliest" if config.from_earliest else "latest",
            # The table's changelog gets a write per counted record: 50 ms lets them share requests (at-least-once
            # either way: each bucket remembers the last offset it counted).
            producer_linger=0.05,
        )
        self.app.transport.Consumer = _ReadCommittedConsumer
        self.table = self.app.Table("feature-log", default=None, partitions=config.partitions)
        reference_id, reference = references()
        self.window = FeatureLogWindow(self.table, reference_id, reference, config.bucket_ms, config.window_ms)
        self.sampled: deque[PredictionRecord] = deque(maxlen=config.max_sampled)
        self.recent = RecentRequests()
        self._evicted_at: dict[int, float] = {}
        topic = self.app.topic(config.predictions_topic, key_serializer="raw", value_serializer="raw")
        self.app.agent(topic, name="feature-log")(self._count)
        self.app.timer(interval=config.check_interval_s)(self._check)
        if replay is not None:
            self.app.timer(interval=config.consistency_interval_s)(self._replay)

    def thresholds(self) -> dict[str, SkewThresholds]:
        """Each referenced feature's thresholds: its own, or the default."""
        return {name: self.config.feature_thresholds.get(name, self.config.thresholds) for name in self.window.references}

    async def _count(self, stream) -> None:
        async for event in stream.events():
            try:
                record = decode(PredictionRecord, event.value or b"")
            except ContractViolation:
                self.metrics.bad_records.labels(CONTRACT_VIOLATION).inc()
                continue
            problem = self.window.problem(record)
            if problem is not None:
                self.metrics.bad_records.labels(problem).inc()
                continue
            if not self.recent.first_time(record.request_id):
                self.metrics.duplicates.inc()
                continue
            if self.window.add([record], event.message.partition, event.message.offset):
                self.metrics.records.inc()
            if any(sampled(key, self.config.sample_rate) for key in record.entity_keys.values()):
                self.sampled.append(record)
            partition, now = event.message.partition, time.monotonic()
            if now - self._evicted_at.get(partition, 0.0) > self.config.bucket_ms / 1000:
                # A table changes only inside stream iteration (faust), and a deletion goes to the changelog partition
                # of the record in hand: each partition's old buckets go while one of its records is handled.
                for key in self.window.stale(int(time.time() * 1000), partition):
                    del self.table[key]
                self._evicted_at[partition] = now

    async def _check(self) -> None:
        try:
            reference_id, reference = await asyncio.to_thread(self.references)
        except Exception as err:  # the model registry or snapshot store is down: keep measuring against the last reference
            log.warning("could not refresh the reference, measuring against %s: %r", self.window.reference_id, err)
        else:
            if reference_id != self.window.reference_id:
                log.warning("skew is now measured against %s (was %s)", reference_id, self.window.reference_id)
                self.window.use(reference_id, reference)
        skews = self.window.skews(int(time.time() * 1000))
        self.metrics.publish_skews(skews, self.config.min_rows, self.thresholds(), self.window.reference_id)

    async def _replay(self) -> None:
        settled_before = int(time.time() * 1000) - self.config.settle_ms
        batch = []
        while self.sampled and self.sampled[0].scored_at_ms <= settled_before:
            batch.append(self.sampled.popleft())
        if not batch:
            return
        try:
            report = await asyncio.to_thread(self.replay, batch)
        except Exception as err:  # the event log is unreachable: these requests are not replayed
            log.warning("consistency replay of %d requests failed: %r", len(batch), err)
            return
        self.metrics.publish_consistency(report)

    def run(self) -> None:
        """Run the faust worker until SIGTERM or SIGINT; stopped within ``shutdown_timeout_s`` whatever faust does."""
        _BoundedWorker(self.app, self.config.shutdown_timeout_s, loglevel="WARN", quiet=True).execute_from_commandline()


class _ReadCommittedThread(AIOKafkaConsumerThread):
    """faust 0.15 reads read_committed only under its exactly-once guarantee; this consumer does at least once too."""

    def _create_worker_consumer(self, transport):
        # The flag decides only the isolation level here; faust's commits read the app's guarantee, not this flag.
        self.consumer.in_transaction = True
        try:
            return super()._create_worker_consumer(transport)
        finally:
            self.consumer.in_transaction = False


class _ReadCommittedConsumer(AIOKafkaConsumer):
    """faust's aiokafka consumer, reading read_committed."""

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _ReadCommittedThread(self, loop=self.loop, beacon=self.beacon)


class _BoundedWorker(faust.Worker):
    """A faust worker whose SIGTERM always ends the process: faust 0.15 can fail while stopping (seen under its
    exactly-once guarantee: "Not in the middle of a transaction") and then never exits. Exiting is safe: the
    restarted monitor resumes from its last committed offsets and skips what its buckets counted already."""

    def __init__(self, app: faust.App, shutdown_timeout_s: float, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.shutdown_timeout_s = shutdown_timeout_s

    def _on_sigterm(self) -> None:
        timer = threading.Timer(self.shutdown_timeout_s, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
        super()._on_sigterm()
