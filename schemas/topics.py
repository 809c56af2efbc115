"""Topic specs: the name, shape and retention of a topic; Loopline's own topics here, a project's in its project file
(``schemas/project.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from pydantic import BaseModel

from schemas.records import DeadLetterRecord, PredictionRecord, ScoreRequest, TrainingExample

DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """How one topic is laid out and what it carries.

    ``key`` names the record field used as the Kafka message key, so that all records of one
    entity land on one partition in order.
    """

    name: str
    record_type: type[BaseModel]
    key: str
    partitions: int
    retention_ms: int
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"

    def configs(self) -> dict[str, str]:
        """The topic-level Kafka configs this spec sets."""
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}


class Replication(NamedTuple):
    """How many brokers hold each partition of a topic, and how many of them an ``acks=all`` write needs."""

    factor: int
    min_insync: int


def replication_for(brokers: int) -> Replication:
    """The replication a cluster of ``brokers`` gives Loopline's topics unless told otherwise: up to 3 replicas, and one
    replica fewer in sync than there are (so a write survives any one broker's loss, and writes go on while one is down).
    """
    factor = min(3, brokers)
    return Replication(factor, factor - 1 if factor >= 2 else 1)


SCORE_REQUESTS = TopicSpec("scoring.requests", ScoreRequest, key="request_id", partitions=6, retention_ms=1 * DAY_MS)
PREDICTIONS = TopicSpec("scoring.predictions", PredictionRecord, key="request_id", partitions=6, retention_ms=30 * DAY_MS)
DEAD_LETTERS = TopicSpec("events.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=30 * DAY_MS)
TRAINING_EXAMPLES = TopicSpec("training.examples", TrainingExample, key="event_id", partitions=3, retention_ms=90 * DAY_MS)

#: Loopline's own topics, whatever the project: requests, predictions, dead letters, training examples.
TOPICS: tuple[TopicSpec, ...] = (SCORE_REQUESTS, PREDICTIONS, DEAD_LETTERS, TRAINING_EXAMPLES)
