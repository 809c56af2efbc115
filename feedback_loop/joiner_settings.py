"""The feedback joiner's settings: plain values, so that building them needs no PyFlink."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from schemas.contracts import parse_contract
from schemas.project import LabelPlan
from schemas.topics import DEAD_LETTERS, PREDICTIONS, TRAINING_EXAMPLES
from streams.job_settings import settings_from_json, settings_json


@dataclass(frozen=True)
class JoinerSettings:
    """Where the joiner reads, writes and checkpoints; its label source (the project's: ``label``, as
    :meth:`label_plan` reads it back), its horizon and knobs."""

    bootstrap_servers: str
    connector_jar: Path
    #: The joiner's JVM operator (feedback_loop/jvm), compiled by streams/operators_jar.py.
    operators_jar: Path
    #: A path or any Flink filesystem URI (``file:///shared/...``, ``s3://bucket/...``): checkpoints and savepoints.
    checkpoint_dir: str
    horizon_ms: int
    #: The project's label source (``schemas/project.LabelPlan``) as plain values: its contract as Avro schema JSON.
    label: dict
    group_id: str
    #: How far out of order the records' Kafka timestamps may come.
    out_of_orderness_ms: int
    checkpoint_interval_ms: int
    metrics_port: int | None
    predictions_topic: str = PREDICTIONS.name
    examples_topic: str = TRAINING_EXAMPLES.name
    dead_letter_topic: str = DEAD_LETTERS.name
    #: A source with nothing new for this long does not hold the watermark back.
    idle_timeout_ms: int = 5_000
    parallelism: int = 1
    #: Kept out of the repr: the client properties may hold secrets.
    kafka_properties: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> str:
        """The settings as JSON (paths as strings), to hand to a joiner started on a cluster."""
        return settings_json(self)

    @classmethod
    def from_json(cls, text: str) -> JoinerSettings:
        """The inverse of ``to_json``."""
        return settings_from_json(cls, text)

    @property
    def labels_topic(self) -> str:
        return self.label["topic"]

    def label_plan(self) -> LabelPlan:
        """The label source."""
        plain = dict(self.label)
        plain["contract"] = parse_contract(plain.pop("contract_schema"), f"the label contract of {plain['topic']}")
        return LabelPlan(**plain)


def plain_label(plan: LabelPlan, topic: str | None = None) -> dict:
    """``plan`` as plain values for :class:`JoinerSettings` (reading ``topic`` instead of its own when given)."""
    plain = {name: getattr(plan, name) for name in LabelPlan.__dataclass_fields__ if name != "contract"}
    return {**plain, "topic": topic or plan.topic, "contract_schema": dict(plan.contract.schema)}
