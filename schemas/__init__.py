"""Loopline's contracts: event and record types, their validation, topic specs and compatibility rules.

This package is the one source of truth for what travels on Loopline's topics. It imports
nothing else of Loopline's.
"""

from schemas.compatibility import CompatibilityError, check_compatible
from schemas.records import (
    RECORD_TYPES,
    DeadLetterRecord,
    LabelEvent,
    PredictionRecord,
    Record,
    ScoreRequest,
    TrainingExample,
    TransactionEvent,
)
from schemas.topics import TOPICS, TopicSpec, topic_spec
from schemas.validation import ContractViolation, FieldError, decode, encode

__all__ = [
    "RECORD_TYPES",
    "TOPICS",
    "CompatibilityError",
    "ContractViolation",
    "DeadLetterRecord",
    "FieldError",
    "LabelEvent",
    "PredictionRecord",
    "Record",
    "ScoreRequest",
    "TopicSpec",
    "TrainingExample",
    "TransactionEvent",
    "check_compatible",
    "decode",
    "encode",
    "topic_spec",
]
