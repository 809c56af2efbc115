"""Decoding and validating records with precise errors (field and reason)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from schemas.records import Record

R = TypeVar("R", bound=Record)

#: Field name used when the problem is the payload as a whole (not JSON, not an object).
WHOLE_PAYLOAD = "<payload>"
#: The deepest JSON nesting a payload may have: every contract is at most a few levels deep, and a
#: deeper payload (``[[[[...]]]]``) would only cost a parser's recursion.
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class FieldError:
    """One problem with one field."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class ContractViolation(ValueError):
    """A payload does not satisfy its record contract. ``errors`` lists every problem found."""

    def __init__(self, record_name: str, errors: list[FieldError]) -> None:
        self.record_name = record_name
        self.errors = errors
        super().__init__(f"invalid {record_name}: " + "; ".join(str(e) for e in errors))

    @property
    def field(self) -> str:
        """The first offending field."""
        return self.errors[0].field

    @property
    def reason(self) -> str:
        """Why the first offending field is wrong."""
        return self.errors[0].reason


def _violation(record_type: type[Record], field: str, reason: str) -> ContractViolation:
    return ContractViolation(record_type.RECORD_NAME, [FieldError(field, reason)])


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(payload: bytes | str, limit: int) -> int:
    """How deeply ``payload``'s JSON arrays and objects nest, counting no further than ``limit + 1``."""
    text = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else payload
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def decode(record_type: type[R], payload: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> R:
    """Parse and validate one JSON payload as ``record_type``.

    Raises ContractViolation naming the field and the reason when the payload is not JSON, nests
    deeper than ``max_depth``, is not an object, carries a schema version this reader does not
    know, or breaks a field rule. It never raises anything else, whatever the bytes.
    """
    try:
        # Fast path: pydantic parses and validates in one pass (its parser bounds recursion itself).
        # Anything it refuses takes the slow path below, which finds the precise field and reason.
        record = record_type.model_validate_json(payload)
        if record.schema_version == record_type.SCHEMA_VERSION:
            return record
    except ValidationError:
        pass
    if json_depth(payload, max_depth) > max_depth:
        raise _violation(record_type, WHOLE_PAYLOAD, f"JSON nested deeper than {max_depth} levels")
    try:
        data = json.loads(payload)
    except ValueError as exc:  # not UTF-8, not JSON, or an integer beyond the interpreter's digit limit
        raise _violation(record_type, WHOLE_PAYLOAD, f"not valid JSON ({exc})") from None
    except RecursionError:  # nesting within the limit, but the interpreter's stack is smaller
        raise _violation(record_type, WHOLE_PAYLOAD, "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise _violation(record_type, WHOLE_PAYLOAD, f"expected a JSON object, got {type(data).__name__}")
    broken = _not_unicode(data)
    if broken is not None:
        # JSON lets a string escape half a UTF-16 pair ("\ud800"); such a string cannot be written as UTF-8 again
        # (a log line, a Kafka record, a metric label), so no contract takes it.
        raise _violation(record_type, broken or WHOLE_PAYLOAD, "text holds a lone UTF-16 surrogate (not valid Unicode)")
    version = data.get("schema_version")
    if version is None:
        raise _violation(record_type, "schema_version", "missing")
    if version in record_type.READS and not isinstance(version, bool):
        data = record_type.upgrade(data, version)
    elif version != record_type.SCHEMA_VERSION:
        known = sorted({record_type.SCHEMA_VERSION, *record_type.READS})
        raise _violation(record_type, "schema_version", f"unsupported schema version {version!r} (this reader knows {known})")
    return validate(record_type, data)


def _not_unicode(value: object, path: str = "") -> str | None:
    """The dotted path of the first key or string in parsed JSON that is not valid Unicode, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    entries = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in entries:
        # The path goes into error messages: a key that is not valid Unicode is shown escaped.
        name = str(key).encode("utf-8", "backslashreplace").decode()
        where = f"{path}.{name}" if path else name
        if isinstance(key, str) and _not_unicode(key) is not None:
            return where
        found = _not_unicode(item, where)
        if found is not None:
            return found
    return None


def validate(record_type: type[R], data: dict) -> R:
    """Validate already-parsed fields as ``record_type``; ContractViolation naming each bad field."""
    try:
        return record_type.model_validate(data)
    except ValidationError as exc:
        raise violation(record_type, exc) from None


def violation(record_type: type[Record], error: ValidationError) -> ContractViolation:
    """``error`` as a ContractViolation of ``record_type``: field paths as dotted names, reasons without
    pydantic's prefixes."""
    errors = [
        FieldError(".".join(str(part) for part in err["loc"]) or WHOLE_PAYLOAD, err["msg"].removeprefix("Value error, "))
        for err in error.errors(include_url=False)
    ]
    return ContractViolation(record_type.RECORD_NAME, errors)


def encode(record: Record) -> bytes:
    """Serialise a record to its JSON wire form."""
    return record.model_dump_json().encode()
