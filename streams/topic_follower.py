"""Follow a topic from its start on a background thread: each committed record that decodes and that the caller keeps
is handed over as it arrives (the demo's live tables, its feedback loop)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from confluent_kafka import Consumer, Message
from pydantic import BaseModel

from schemas.kafka_config import consumer_settings
from schemas.validation import ContractViolation, decode

RecordT = TypeVar("RecordT", bound=BaseModel)


class TopicFollower(Generic[RecordT]):
    """Reads ``topic`` from its start as a read_committed consumer of a group of its own, decodes each record as
    ``record_type`` and calls ``handle(message, record)`` for those ``keep(message, record)`` accepts. Records that
    do not decode are skipped: a follower only watches, the topic's writers dead-letter what is bad."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        record_type: type[RecordT],
        handle: Callable[[Message, RecordT], None],
        keep: Callable[[Message, RecordT], bool] = lambda message, record: True,
        client_config: Mapping[str, str] | None = None,
        wanted: Callable[[Message], bool] = lambda message: True,
    ) -> None:
        """``wanted`` picks messages before they are decoded (by key, say: a topic holding others' records costs
        only their keys)."""
        # A watcher needs no record the moment it is written: fetches wait for 64 KiB or 100 ms rather than returning
        # with each record (one fetch per record is a busy topic's largest load on the broker).
        self._consumer_config = consumer_settings(
            bootstrap_servers,
            client_config,
            f"loopline-follower-{uuid.uuid4().hex[:12]}",
            {"fetch.min.bytes": 65536, "fetch.wait.max.ms": 100},
        )
        self.topic, self._record_type, self._handle, self._keep, self._wanted = topic, record_type, handle, keep, wanted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)

    def start(self) -> TopicFollower[RecordT]:
        """Start following; returns the follower."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop following and close the consumer (waiting up to ``timeout_s``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        consumer = Consumer(self._consumer_config)
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                for message in consumer.consume(1000, timeout=0.2):
                    if message.error() is not None or not self._wanted(message):
                        continue
                    try:
                        record = decode(self._record_type, message.value() or b"")
                    except ContractViolation:
                        continue
                    if self._keep(message, record):
                        self._handle(message, record)
        finally:
            consumer.close()
