"""The feedback joiner's settings: plain values, so that building them needs no PyFlink."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from schemas.topics import DEAD_LETTERS, LABELS, PREDICTIONS, TRAINING_EXAMPLES
from streams.job_settings import settings_from_json, settings_json


@dataclass(frozen=True)
class JoinerSettings:
    """Where the joiner reads, writes and checkpoints; its horizon and knobs."""

    bootstrap_servers: str
    connector_jar: Path
    #: The joiner's JVM operator (feedback_loop/jvm), compiled by streams/operators_jar.py.
    operators_jar: Path
    #: A path or any Flink filesystem URI (``file:///shared/...``, ``s3://bucket/...``): checkpoints and savepoints.
    checkpoint_dir: str
    horizon_ms: int
    group_id: str
    #: How far out of order the records' Kafka timestamps may come.
    out_of_orderness_ms: int
    checkpoint_interval_ms: int
    metrics_port: int | None
    predictions_topic: str = PREDICTIONS.name
    labels_topic: str = LABELS.name
    examples_topic: str = TRAINING_EXAMPLES.name
    dead_letter_topic: str = DEAD_LETTERS.name
    #: A source with nothing new for this long does not hold the watermark back.
    idle_timeout_ms: int = 5_000
    parallelism: int = 1
    kafka_properties: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The settings as JSON (paths as strings), to hand to a joiner started on a cluster."""
        return settings_json(self)

    @classmethod
    def from_json(cls, text: str) -> JoinerSettings:
        """The inverse of ``to_json``."""
        return settings_from_json(cls, text)
