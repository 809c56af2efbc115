"""Contracts: precise validation errors (a project's events by their contract, here the fraud template's
transactions), dead-letter wrapping, and the compatibility check of Loopline's own records."""

from __future__ import annotations

import base64
import json
from typing import ClassVar

import pytest
from pydantic import Field

from schemas import ContractViolation, DeadLetterRecord, Record, decode, encode
from schemas.compatibility import CompatibilityError, check_compatible, check_registered_schemas, json_schema, register_schemas
from tests.support.templates import FRAUD, TRANSACTIONS

GOOD = {
    "schema_version": 1,
    "event_id": "e-1",
    "event_time_ms": 1_700_000_000_000,
    "user_id": "u000001",
    "merchant_id": "m00001",
    "amount": 12.5,
    "currency": "EUR",
    "merchant_category": "grocery",
    "channel": "pos",
    "country": "DE",
}


def payload(**changes) -> bytes:
    data = {**GOOD, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not ...}).encode()


CONTRACT = FRAUD.contract(TRANSACTIONS.name)


@pytest.mark.parametrize("wire", ["json", "avro"])
def test_valid_event_round_trips(wire: str) -> None:
    event = CONTRACT.decode(payload())
    assert event.amount == 12.5
    assert CONTRACT.decode(CONTRACT.encode(event, wire), wire) == event


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    assert CONTRACT.decode(payload(added_later="x")).user_id == "u000001"


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        (payload(amount="12,50"), "amount", "valid number"),
        (payload(amount=True), "amount", "valid number"),
        (payload(amount=-1), "amount", "greater than or equal to 0"),
        (payload(user_id=...), "user_id", "Field required"),
        (payload(currency="euro"), "currency", "does not match the pattern"),
        (payload(channel="fax"), "channel", "'online', 'pos' or 'atm'"),
        (payload(schema_version=99), "schema_version", "less than or equal to 1"),
        (payload(schema_version=...), "schema_version", "Field required"),
        (b'{"schema_version": 1, "amount": ', "<payload>", "not valid JSON"),
        (b"[1, 2]", "<payload>", "expected a JSON object"),
        (b"\xff\xfe", "<payload>", "not UTF-8"),
        # An integer beyond the interpreter's digit limit for str -> int (4,300 digits): Python's json raises ValueError.
        (payload(amount=...)[:-1] + b', "amount": ' + b"9" * 5000 + b"}", "<payload>", "not valid JSON"),
        # Half a UTF-16 pair is valid JSON but not Unicode: refused wherever it hides, keys included.
        (payload(user_id="u\ud800"), "<payload>", "lone UTF-16 surrogate"),
        (payload(added_later={"k\udfff": 1}), "<payload>", "lone UTF-16 surrogate"),
    ],
)
def test_invalid_events_name_field_and_reason(raw: bytes, field: str, reason: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.decode(raw)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert field in str(caught.value)


def test_dead_letter_keeps_payload_bytes_exactly() -> None:
    raw = b"\x00\xffnot utf-8"
    record = DeadLetterRecord.for_payload(
        reason="invalid",
        error="bad",
        error_field="<payload>",
        source_topic="events.transactions",
        source_partition=2,
        source_offset=41,
        key=b"u1",
        payload=raw,
        consumer="test",
    )
    assert record.payload_encoding == "base64"
    assert base64.b64decode(record.payload) == raw
    assert decode(DeadLetterRecord, encode(record)) == record


class _V1(Record):
    RECORD_NAME: ClassVar[str] = "thing"
    thing_id: str
    amount: float


class _V1PlusOptional(_V1):
    note: str | None = Field(default=None, description="added later")


class _V1RemovedAmount(Record):
    RECORD_NAME: ClassVar[str] = "thing"
    thing_id: str


class _V1AmountAsText(Record):
    RECORD_NAME: ClassVar[str] = "thing"
    thing_id: str
    amount: str


class _V1PlusRequired(_V1):
    region: str


def test_additive_optional_field_is_accepted() -> None:
    check_compatible("thing", json_schema(_V1), json_schema(_V1PlusOptional))


@pytest.mark.parametrize(
    ("new", "problem"),
    [
        (_V1RemovedAmount, "removed required field 'amount'"),
        (_V1AmountAsText, "changed the type or constraints of field 'amount'"),
        (_V1PlusRequired, "added required field 'region'"),
    ],
)
def test_breaking_changes_are_rejected(new: type[Record], problem: str) -> None:
    with pytest.raises(CompatibilityError) as caught:
        check_compatible("thing", json_schema(_V1), json_schema(new))
    assert any(problem in p for p in caught.value.problems)


def test_current_contracts_match_their_registered_schemas() -> None:
    assert set(check_registered_schemas().values()) == {"unchanged"}


def test_register_refuses_a_breaking_change(tmp_path) -> None:
    register_schemas(tmp_path)
    registered = tmp_path / "prediction.v1.json"
    schema = json.loads(registered.read_text())
    schema["properties"]["score"]["type"] = "string"
    registered.write_text(json.dumps(schema))
    with pytest.raises(CompatibilityError, match="score"):
        register_schemas(tmp_path)
    assert json.loads(registered.read_text())["properties"]["score"]["type"] == "string"
