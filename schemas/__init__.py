"""Loopline's contracts: its own records, the contracts a project declares for its events, their validation, topic
specs, compatibility rules and the project file.

This package is the one source of truth for what travels on Loopline's topics. It imports
nothing else of Loopline's.
"""

from schemas.compatibility import CompatibilityError, check_compatible
from schemas.records import (
    RECORD_TYPES,
    DeadLetterRecord,
    PredictionRecord,
    Record,
    ScoreRequest,
    TrainingExample,
)
from schemas.topics import TOPICS, TopicSpec
from schemas.validation import ContractViolation, FieldError, decode, encode

__all__ = [
    "RECORD_TYPES",
    "TOPICS",
    "CompatibilityError",
    "ContractViolation",
    "DeadLetterRecord",
    "FieldError",
    "PredictionRecord",
    "Record",
    "ScoreRequest",
    "TopicSpec",
    "TrainingExample",
    "check_compatible",
    "decode",
    "encode",
]
