"""Publish records to Kafka with an idempotent producer, paced in real time."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer

from schemas.kafka_config import producer_settings
from streams.errors import StreamsError
from streams.world import Emitted


@dataclass
class PublishStats:
    """What a publish run delivered, per topic, and how long it took."""

    delivered: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        """All records delivered."""
        return sum(self.delivered.values())


class DeliveryError(StreamsError, RuntimeError):
    """Some records could not be delivered; nothing was silently dropped."""


class EventProducer:
    """An idempotent (exactly-once per partition, in order) confluent-kafka producer."""

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str = "loopline-producer",
        client_config: Mapping[str, str] | None = None,
        linger_ms: float = 5.0,
    ) -> None:
        """``client_config``: extra librdkafka settings (security.protocol, sasl.*, ssl.*). ``linger_ms``: how long a
        record may wait for others to share its request (fewer, larger requests for the broker; that much more
        latency)."""
        self._producer = Producer(
            producer_settings(
                bootstrap_servers, client_config, {"client.id": client_id, "linger.ms": linger_ms, "compression.type": "lz4"}
            )
        )

    def publish(
        self,
        records: Iterable[Emitted],
        *,
        rate_per_s: float | None = None,
        duration_s: float | None = None,
        wall_clock: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> PublishStats:
        """Publish ``records`` in order; raise DeliveryError if any is not acknowledged.

        With ``rate_per_s``/``duration_s`` the records are paced on their stream time
        (``emit_at_ms``) so bursts stay bursts; without, they go as fast as Kafka takes them.
        With ``wall_clock`` each record goes when the wall clock reaches its stream time: the part of a stream
        that lies in the past goes at once (a backlog of history), the rest in real time, with no gap between.
        ``duration_s`` stops at that much stream time; ``on_progress`` gets the count published.
        """
        stats = PublishStats()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            (stats.failed if err else stats.delivered)[msg.topic()] += 1

        began = time.monotonic()
        first_ms: int | None = None
        published = 0
        for record in records:
            first_ms = record.emit_at_ms if first_ms is None else first_ms
            offset_s = (record.emit_at_ms - first_ms) / 1000.0
            if duration_s is not None and offset_s >= duration_s:
                break
            if wall_clock or rate_per_s is not None:
                # poll() returns early when a delivery report comes in: wait again until the record is due.
                while (
                    wait := record.emit_at_ms / 1000 - time.time() if wall_clock else offset_s - (time.monotonic() - began)
                ) > 0:
                    self._producer.poll(wait)
            while True:
                try:
                    self._producer.produce(record.topic, record.value, record.key, on_delivery=delivered)
                    break
                except BufferError:  # local queue full: let deliveries drain, then retry
                    self._producer.poll(0.05)
            published += 1
            if published % 1000 == 0:
                self._producer.poll(0)
                if on_progress:
                    on_progress(published)
        remaining = self._producer.flush(60.0)
        stats.seconds = time.monotonic() - began
        if on_progress:
            on_progress(published)
        if remaining or stats.failed:
            raise DeliveryError(
                f"{sum(stats.failed.values())} records failed and {remaining} were not acknowledged of {published} published"
            )
        return stats
