"""The feature job decodes events in the JVM (``EventContract.java``), the offline recompute in Python
(``schemas/contracts.py``): both must take exactly the same events, with the same values, and refuse the same ones
naming the same field. A Java driver (``tests/support/jvm``) answers the JVM's verdict on payloads Hypothesis writes: valid
events, events with fields missing, repeated, of the wrong type or at the edges of their range, text that is not
UTF-8 or not JSON, nesting around the depth limit, lone surrogates, and Avro records, truncated or with bytes after.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schemas.contracts import MAX_JSON_DEPTH, ContractError, parse_contract
from schemas.validation import ContractViolation
from tests.support.jvm_driver import JvmDriver, jvm_driver

CONTRACT = parse_contract(
    {
        "type": "record",
        "name": "probe",
        "fields": [
            {"name": "id", "type": "string", "constraints": {"minLength": 1, "maxLength": 8}},
            {"name": "at_ms", "type": "long", "constraints": {"exclusiveMinimum": 0}},
            {"name": "amount", "type": "double", "constraints": {"minimum": 0, "exclusiveMaximum": 1e6}},
            {"name": "code", "type": "string", "constraints": {"pattern": "[A-Z]{2}\\d"}},
            {"name": "kind", "type": {"type": "enum", "name": "kind", "symbols": ["a", "b"]}},
            {"name": "small", "type": "int", "constraints": {"maximum": 1000}},
            {"name": "count", "type": "long", "constraints": {"minimum": -5, "maximum": 99}},
            {"name": "ratio", "type": "float", "constraints": {"maximum": 2.5}},
            {"name": "flag", "type": "boolean"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "zone", "type": "string", "default": "z0"},
        ],
    }
)


class Replay:
    """The Java driver (``ContractReplay``) holding ``CONTRACT``."""

    def __init__(self, driver: JvmDriver) -> None:
        self.driver = driver
        driver.tell(f"contract {CONTRACT.jvm_spec()}")

    def decode(self, payload: bytes, wire: str) -> tuple[str, object]:
        """("ok", the values) or ("invalid", the field at fault), as the JVM decides."""
        verdict, _, rest = self.driver.ask(f"decode {wire} {payload.hex()}").partition(" ")
        return verdict, json.loads(rest) if verdict == "ok" else rest


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory):
    with jvm_driver(tmp_path_factory.mktemp("contract"), "ContractReplay") as driver:
        yield Replay(driver)


def python_verdict(payload: bytes, wire: str) -> tuple[str, object]:
    try:
        event = CONTRACT.decode(payload, wire)  # type: ignore[arg-type]
    except ContractViolation as violation:
        return "invalid", violation.field
    return "ok", [getattr(event, name) for name in CONTRACT.field_names]


def assert_same(jvm: tuple[str, object], python: tuple[str, object]) -> None:
    assert jvm[0] == python[0], f"JVM {jvm}, Python {python}"
    if jvm[0] == "invalid":
        assert jvm[1] == python[1], f"JVM names {jvm[1]}, Python {python[1]}"
        return
    for got, want in zip(jvm[1], python[1], strict=True):  # type: ignore[arg-type]
        assert got == want and type(got) is type(want), f"JVM {jvm[1]}, Python {python[1]}"


# Values as JSON text: numbers written as producers write them (exponents, -0, beyond 64 bits), texts with escapes.
NUMBER_TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        [
            "0",
            "-0",
            "1.0",
            "1e2",
            "1E400",
            "-1e-400",
            "2147483647",
            "2147483648",
            "-2147483649",
            "9223372036854775807",
            "9223372036854775808",
            "3.4028235e38",
            "3.5e38",
            "2.5",
            "2.5000001",
            "1e6",
            "999999.99",
            "12345678901234567890123",
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
STRING_TEXT = st.one_of(
    st.text(max_size=10).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.sampled_from(
        [
            '"AB1"',
            '"ab1"',
            '"AB١"',
            '"AB1\\n"',
            '""',
            '"a"',
            '"b"',
            '"c"',
            '"\\ud800"',
            '"\\ud83d\\ude00"',
            '"123456789"',
            '"😀😀"',
        ]
    ),
)
SCALAR_TEXT = st.one_of(NUMBER_TEXT, STRING_TEXT, st.sampled_from(["true", "false", "null", "[]", "{}", "[1, [2]]"]))


def nested(depth: int) -> str:
    """A value nesting ``depth`` levels of arrays and objects."""
    return (
        "".join("[" if i % 2 else '{"k":' for i in range(depth))
        + "0"
        + "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    )


@st.composite
def json_payloads(draw: st.DrawFn) -> bytes:
    """A JSON object close to a valid event: fields left out, given twice, of other types, plus unknown fields."""
    good = {
        "id": '"e1"',
        "at_ms": "5",
        "amount": "1.5",
        "code": '"AB1"',
        "kind": '"a"',
        "small": "3",
        "count": "7",
        "ratio": "0.5",
        "flag": "true",
        "note": '"n"',
        "zone": '"z"',
    }
    changed = draw(st.sets(st.sampled_from(list(good)), max_size=2))
    pairs = []
    for name, text in good.items():
        if name in changed and draw(st.booleans()):
            continue  # left out
        pairs.append((name, draw(SCALAR_TEXT) if name in changed else text))
        if draw(st.integers(0, 12)) == 0:
            pairs.append((name, draw(SCALAR_TEXT)))
    for _ in range(draw(st.integers(0, 1))):
        key = draw(st.sampled_from(["extra", "\\ud800", "deep", "x"]))
        value = nested(draw(st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 1))) if key == "deep" else draw(SCALAR_TEXT)
        pairs.insert(draw(st.integers(0, len(pairs))), (key, value))
    text = "{" + ", ".join(f'"{key}": {value}' for key, value in pairs) + "}"
    if draw(st.integers(0, 3)) == 0:
        text = draw(st.sampled_from([" " + text + "\n", text + " x", text[:-1], "[" + text + "]", "NaN", ""]))
    raw = text.encode("utf-8", "surrogatepass")
    corruption = draw(st.integers(0, 15))
    if corruption == 0 and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = (
            raw[:at] + draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"])) + raw[at:]
        )
    return raw


@st.composite
def avro_payloads(draw: st.DrawFn) -> bytes:
    """An Avro record of the contract, maybe truncated, with bytes after it, or with a byte changed."""
    event = {
        "id": draw(st.text(max_size=9)),
        "at_ms": draw(st.integers(-5, 2**40)),
        "amount": draw(st.floats(-1, 2e6, allow_nan=False)),
        "code": draw(st.sampled_from(["AB1", "ab1", "AB12"])),
        "kind": draw(st.sampled_from(["a", "b"])),
        "small": draw(st.integers(-(2**31), 2**31 - 1)),
        "count": draw(st.integers(-10, 120)),
        "ratio": draw(st.floats(-3, 3, width=32)),
        "flag": draw(st.booleans()),
        "note": draw(st.none() | st.text(max_size=3)),
        "zone": draw(st.text(max_size=3)),
    }
    raw = CONTRACT.encode(event, "avro")
    change = draw(st.integers(0, 5))
    if change == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif change == 1:
        raw += draw(st.binary(min_size=1, max_size=3))
    elif change == 2:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=json_payloads())
def test_json_events_are_decoded_alike(replay: Replay, payload: bytes) -> None:
    assert_same(replay.decode(payload, "json"), python_verdict(payload, "json"))


@settings(max_examples=300, deadline=None)
@given(payload=avro_payloads())
# Found by this test: `small` (an Avro int) as a five-byte varint of 2**31, which fastavro read as a number.
@example(
    payload=b"\x1800\xc2\x80\xc2\x80\xc2\x80\xf0\x90\x80\x80\x80\x80\x80\x01\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\x06AB1\x00\x80\x80\x80\x80\x10\x00\x00\x00\x00\x00\x00\x00\x00"
)
def test_avro_events_are_decoded_alike(replay: Replay, payload: bytes) -> None:
    assert_same(replay.decode(payload, "avro"), python_verdict(payload, "avro"))


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=40), wire=st.sampled_from(["json", "avro"]))
def test_any_bytes_get_the_same_verdict(replay: Replay, payload: bytes, wire: str) -> None:
    assert_same(replay.decode(payload, wire), python_verdict(payload, wire))


BOUNDS = parse_contract(
    {
        "type": "record",
        "name": "bounds",
        "fields": [
            {"name": "price", "type": "double", "constraints": {"minimum": 0.3, "maximum": 99.99}},
            {"name": "units", "type": "long", "constraints": {"minimum": 1, "exclusiveMaximum": 1e3}},
        ],
    }
)


def test_decimal_bounds_and_other_text_encodings_get_the_same_verdict(replay: Replay) -> None:
    """Bounds no double holds exactly (0.3, 99.99: each side takes the double nearest, as Python reads the contract),
    and JSON in another encoding than UTF-8, or behind a byte order mark, which JSON refuses."""
    prices = [
        "0.3",
        "0.29999999999999998",
        "0.29999999999999993",
        "0.30000000000000004",
        "99.99",
        "99.990000000000009",
        "99.99000000000002",
        "1e-400",
        "99.98999999999999",
    ]
    payloads = [f'{{"price": {price}, "units": {units}}}'.encode() for price in prices for units in ("0", "1", "999", "1000")]
    good = b'{"price": 1.5, "units": 3}'
    payloads += [
        b"\xef\xbb\xbf" + good,
        good.decode().encode("utf-16-le"),
        good.decode().encode("utf-16"),
        good.decode().encode("utf-32"),
    ]
    replay.driver.tell(f"contract {BOUNDS.jvm_spec()}")
    try:
        verdicts = {payload: replay.decode(payload, "json") for payload in payloads}
    finally:
        replay.driver.tell(f"contract {CONTRACT.jvm_spec()}")
    for payload, jvm in verdicts.items():
        try:
            event = BOUNDS.decode(payload, "json")
        except ContractViolation as violation:
            python: tuple[str, object] = ("invalid", violation.field)
        else:
            python = ("ok", [event.price, event.units])
        assert_same(jvm, python)
    assert verdicts[good.decode().encode("utf-16-le")][0] == verdicts[b"\xef\xbb\xbf" + good][0] == "invalid"
    assert {verdicts[f'{{"price": {p}, "units": 1}}'.encode()][0] for p in ("0.3", "99.99")} == {"ok"}, (
        "a bound takes its own value"
    )


def test_a_valid_event_reads_the_same_on_both_wires(replay: Replay) -> None:
    event = {
        "id": "e1",
        "at_ms": 5,
        "amount": 1.5,
        "code": "AB1",
        "kind": "b",
        "small": -3,
        "count": 99,
        "ratio": 0.5,
        "flag": False,
        "note": None,
        "zone": "z",
    }
    for wire in ("json", "avro"):
        verdict = replay.decode(CONTRACT.encode(event, wire), wire)  # type: ignore[arg-type]
        assert verdict == ("ok", list(event.values()))
        assert_same(verdict, python_verdict(CONTRACT.encode(event, wire), wire))  # type: ignore[arg-type]


def test_what_the_decoder_refuses_names_the_field(replay: Replay) -> None:
    base = {"id": "e1", "at_ms": 5, "amount": 1.5, "code": "AB1", "kind": "a", "small": 3, "count": 0, "ratio": 0.5, "flag": True}
    cases = [
        ({**base, "at_ms": 0}, "at_ms"),
        ({**base, "code": "AB1 "}, "code"),
        ({**base, "kind": "c"}, "kind"),
        ({**base, "small": 2**31}, "small"),
        ({**base, "small": 1001}, "small"),
        ({**base, "count": -6}, "count"),
        ({**base, "ratio": 2.6}, "ratio"),
        ({**base, "amount": 1e6}, "amount"),
        ({k: v for k, v in base.items() if k != "flag"}, "flag"),
        ({**base, "id": "123456789"}, "id"),
    ]
    for event, field in cases:
        payload = json.dumps(event).encode()
        assert replay.decode(payload, "json") == ("invalid", field)
        assert python_verdict(payload, "json") == ("invalid", field)


def test_a_contract_that_loopline_cannot_take_is_refused_naming_the_field() -> None:
    bad = [
        ({"type": "record", "name": "x", "fields": [{"name": "a", "type": "bytes"}]}, "field 'a'"),
        (
            {"type": "record", "name": "x", "fields": [{"name": "a", "type": "long", "constraints": {"pattern": "x"}}]},
            "do not apply",
        ),
        ({"type": "record", "name": "x", "fields": [{"name": "a", "type": ["null", "string", "long"]}]}, "one type with null"),
        (
            {"type": "record", "name": "x", "fields": [{"name": "a", "type": "string", "constraints": {"pattern": "("}}]},
            "not a regular",
        ),
        ({"type": "enum", "name": "x", "symbols": ["a"]}, "record schema"),
        (
            {"type": "record", "name": "x", "fields": [{"name": "a", "type": "string", "constraints": {"pattern": "(?P<n>a)"}}]},
            "read differently",
        ),
        ({"type": "record", "name": "x", "fields": [{"name": "json", "type": "string"}]}, "use themselves"),
        (
            {"type": "record", "name": "x", "fields": [{"name": "a", "type": "int", "constraints": {"minimum": 0.5}}]},
            "whole number",
        ),
        ({"type": "record", "name": "x", "fields": [{"name": "_a", "type": "string"}]}, "underscore"),
    ]
    for schema, words in bad:
        with pytest.raises(ContractError, match=words):
            parse_contract(schema, "probe.avsc")
