"""Event and record types carried on Loopline's topics.

Every record is JSON with a ``schema_version`` field. Times are Unix epoch milliseconds (UTC)
in ``*_ms`` fields: unambiguous, cheap to parse, and what Flink's ``TO_TIMESTAMP_LTZ(ms, 3)``
takes directly. Unknown extra fields are ignored so that an additive change by a writer never
breaks an existing reader (see ``schemas.compatibility``).
"""

from __future__ import annotations

import base64
import math
import sys
import time
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

EpochMillis = int


def _request_value(value: object) -> float | int | str | bool:
    """A request-time value as a model can take it: a finite number, a string or a boolean."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if abs(value) > sys.float_info.max:
            raise ValueError("integer too large for a floating-point number")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("must be a finite number (not NaN or ±Infinity)")
        return value
    raise ValueError("must be a number, a string or a boolean")


#: A request-time field's value. NaN, ±Infinity and integers beyond a double's range are refused here,
#: naming the field, so no model ever sees them (JSON has no NaN; Python's encoder writes it anyway).
RequestValue = Annotated[
    float | int | str | bool, PlainValidator(_request_value, json_schema_input_type=float | int | str | bool)
]


class Record(BaseModel):
    """Base of Loopline's own records: strict types, extra fields ignored, immutable."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    #: The schema version this reader writes; records carrying another are refused unless it reads them too.
    SCHEMA_VERSION: ClassVar[int | None] = 1
    #: Earlier versions this reader still reads, each turned into the current form by ``upgrade``.
    READS: ClassVar[frozenset[int]] = frozenset()
    #: The stable name of the record type, used for registered schema snapshots.
    RECORD_NAME: ClassVar[str] = ""

    schema_version: int = Field(description="Version of this record's schema.")

    @classmethod
    def upgrade(cls, data: dict, version: int) -> dict:
        """The fields of a record of an earlier ``version`` (one of ``READS``) in the current version's form."""
        raise NotImplementedError(f"{cls.RECORD_NAME} v{version} is not read")


class ScoreRequest(Record):
    """A request to score entities with request-time fields (topic ``scoring.requests``)."""

    RECORD_NAME: ClassVar[str] = "score_request"

    request_id: str = Field(min_length=1)
    entity_keys: dict[str, str] = Field(min_length=1, description="Join key -> value: the entities of the views the model reads.")
    request_fields: dict[str, RequestValue] = Field(
        default_factory=dict,
        description="Values known only at request time, by the request source's field names (finite numbers, strings, booleans).",
    )
    requested_at_ms: EpochMillis = Field(gt=0)
    model_name: str | None = Field(default=None, description="Model to use; the default model when absent.")
    event_id: str | None = Field(
        default=None, min_length=1, description="The event this request scores: labels join predictions by it."
    )


class PredictionRecord(Record):
    """One scored request with the exact features used (topic ``scoring.predictions``)."""

    RECORD_NAME: ClassVar[str] = "prediction"

    request_id: str = Field(min_length=1)
    entity_keys: dict[str, str] = Field(min_length=1)
    features: dict[str, float | int | str | bool | None] = Field(
        description="The exact feature vector given to the model, by feature name."
    )
    defaulted_features: list[str] = Field(default_factory=list, description="Features that fell back to their declared default.")
    defaulted_reasons: dict[str, str] = Field(
        default_factory=dict,
        description="Why each defaulted feature was: missing (the store had no value for it), over_budget (the read "
        "outlasted serving.feature_budget_ms on a scorer that was not refusing work), unavailable (the store down, or "
        "its reads' queue full), no_entity (the request lacks the view's join key). A stale feature is not defaulted: "
        "see stale_features.",
    )
    model_name: str = Field(min_length=1)
    model_version: str = Field(min_length=1)
    score: float = Field(allow_inf_nan=False)
    stage_latency_ms: dict[str, float] = Field(
        default_factory=dict, description="Latency per stage: feature_fetch, queue_wait, inference, total."
    )
    requested_at_ms: EpochMillis = Field(gt=0)
    scored_at_ms: EpochMillis = Field(gt=0)
    event_id: str | None = Field(default=None, min_length=1, description="The event the request scored (its request's event_id).")
    feature_row_times_ms: dict[str, int] = Field(
        default_factory=dict,
        description="Per feature view, the event time of the online row the features were read from (views with a row): "
        "tells a lagging feature from a wrong one.",
    )
    feature_row_absorbed: dict[str, str] = Field(
        default_factory=dict,
        description="Per feature view, the log positions behind that row (each partition's last absorbed offset, "
        "'partition:offset,...'): exactly which events it held, for the consistency replay.",
    )
    stale_features: list[str] = Field(
        default_factory=list,
        description="Features whose view's job lagged the request's time: read as of its progress, not the request's time.",
    )
    feature_read_as_of_ms: dict[str, int] = Field(
        default_factory=dict,
        description="Per feature view read as of its job's progress (its features stale), that progress: the time its "
        "windows were read at instead of requested_at_ms.",
    )
    trace_id: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="The request's trace (W3C trace id), when the scorer traces requests.",
    )


class TrainingExample(Record):
    """A scored event with the exact features the scorer used and, once known, its label (topic ``training.examples``).

    ``label`` is the outcome as a number: 1.0 or 0.0 for a binary label, the value itself for a numeric one; None for
    an event still unlabeled when the feedback horizon passed (for a binary label, positive-unlabeled:
    most such events are negatives, but not all). Version 1 carried binary labels only, as booleans; it is still read."""

    RECORD_NAME: ClassVar[str] = "training_example"
    SCHEMA_VERSION: ClassVar[int] = 2
    READS: ClassVar[frozenset[int]] = frozenset({1})

    event_id: str = Field(min_length=1)
    request_id: str = Field(min_length=1)
    entity_keys: dict[str, str] = Field(min_length=1)
    features: dict[str, float | int | str | bool | None] = Field(description="The exact inputs the model was given.")
    defaulted_features: list[str] = Field(default_factory=list)
    model_name: str = Field(min_length=1)
    model_version: str = Field(min_length=1)
    score: float = Field(allow_inf_nan=False)
    label: float | None = Field(
        allow_inf_nan=False, description="The outcome (binary: 1.0 or 0.0); None when unlabeled at the horizon."
    )
    label_source: str | None = Field(default=None, description="Where the outcome came from, when the label source says.")
    requested_at_ms: EpochMillis = Field(gt=0)
    predicted_at_ms: EpochMillis = Field(gt=0, description="When the scorer scored it.")
    label_time_ms: EpochMillis | None = Field(default=None, gt=0)
    joined_at_ms: EpochMillis = Field(gt=0, description="When the joiner emitted it.")

    @classmethod
    def upgrade(cls, data: dict, version: int) -> dict:
        """Version 1 (binary labels as booleans) in version 2's form: the label as 1.0 or 0.0."""
        label = data.get("label")
        return {**data, "schema_version": cls.SCHEMA_VERSION, "label": float(label) if isinstance(label, bool) else label}


class DeadLetterRecord(Record):
    """A record some Loopline consumer could not process, with why and where it came from."""

    RECORD_NAME: ClassVar[str] = "dead_letter"

    reason: str = Field(min_length=1, description="Short machine-friendly reason, e.g. 'invalid', 'late'.")
    error_field: str | None = Field(default=None, description="The offending field, when one is known.")
    error: str = Field(description="Human-readable explanation.")
    source_topic: str = Field(min_length=1)
    source_partition: int = Field(ge=0)
    source_offset: int = Field(ge=0)
    key: str | None = Field(default=None, description="The record key, decoded as UTF-8 (base64 if it is not).")
    payload: str = Field(description="The original value, UTF-8 (base64 if it is not).")
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    consumer: str = Field(min_length=1, description="Which consumer dead-lettered it.")
    failed_at_ms: EpochMillis = Field(gt=0)

    @classmethod
    def for_payload(
        cls,
        *,
        reason: str,
        error: str,
        error_field: str | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        key: bytes | None,
        payload: bytes | None,
        consumer: str,
    ) -> DeadLetterRecord:
        """Wrap an unprocessable Kafka record, keeping its bytes exactly (base64 when not UTF-8)."""
        raw = payload or b""
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode(), "base64"
        return cls(
            schema_version=cls.SCHEMA_VERSION,
            reason=reason,
            error=error,
            error_field=error_field,
            source_topic=source_topic,
            source_partition=source_partition,
            source_offset=source_offset,
            key=None if key is None else key.decode("utf-8", errors="backslashreplace"),
            payload=text,
            payload_encoding=encoding,
            consumer=consumer,
            failed_at_ms=int(time.time() * 1000),
        )


RECORD_TYPES: tuple[type[Record], ...] = (
    ScoreRequest,
    PredictionRecord,
    TrainingExample,
    DeadLetterRecord,
)
