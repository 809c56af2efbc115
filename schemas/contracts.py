"""Event contracts a project declares: one Avro record schema per event type, with Loopline's constraints.

A contract is the file a team writes once for its events (``contracts/<name>.avsc`` in its project): an Avro record
schema, the form Feast's ``AvroFormat`` takes verbatim and Kafka schema registries keep, so one file describes the
event on both wire formats Loopline reads, JSON and Avro. A field may add ``constraints``, in JSON Schema's words::

    {"name": "price", "type": "double", "constraints": {"minimum": 0}}
    {"name": "country", "type": "string", "constraints": {"pattern": "[A-Z]{2}"}}

Field types: ``string``, ``boolean``, ``int``, ``long``, ``float``, ``double``, an ``enum``, and any of them in a union
with ``null`` (optional). A field with a ``default`` may be left out. Constraints: ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum`` (numbers), ``minLength``, ``maxLength`` and ``pattern`` (strings; a pattern
must match the whole value). Numbers are finite; an ``int`` fits 32 bits, a ``long`` 64, a ``float`` a 32-bit float.

Everything else is derived from the contract, never written again: the validation of an event (here, as a pydantic
model; in the feature job, by the JVM decoder from :meth:`EventContract.jvm_spec`, tested to agree with this one),
the recompute's columns, the DDL of Feast's ``JsonFormat`` and the schema of its ``AvroFormat``, and the compatibility
check of a changed contract. A pattern keeps to the regular expressions Python and Java read alike.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from schemas.errors import SchemasError
from schemas.validation import WHOLE_PAYLOAD, ContractViolation, FieldError, violation

#: The wire formats of events: JSON objects, or Avro binary (the schema's own encoding, no header).
WireFormat = Literal["json", "avro"]
#: The deepest a JSON event may nest (a contract is flat; only fields it does not know may nest at all).
MAX_JSON_DEPTH = 32
_PRIMITIVES = ("string", "boolean", "int", "long", "float", "double")
_SQL_TYPES = {
    "string": "STRING",
    "enum": "STRING",
    "boolean": "BOOLEAN",
    "int": "BIGINT",
    "long": "BIGINT",
    "float": "DOUBLE",
    "double": "DOUBLE",
}
_INTEGER_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_FLOAT32_MAX = 3.4028234663852886e38
_NUMBER_CONSTRAINTS = {"minimum": "ge", "maximum": "le", "exclusiveMinimum": "gt", "exclusiveMaximum": "lt"}
_STRING_CONSTRAINTS = {"minLength": "min_length", "maxLength": "max_length", "pattern": None}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Regular expression syntax Python and Java read differently, or one of them not at all: a contract's patterns keep
#: to what both read alike (the job checks them in the JVM, the recompute in Python).
_DIALECT_ONLY = {
    "(?P": "Python's named groups",
    "&&": "Java's class intersections",
    "\\p{": "Unicode classes",
    "\\P{": "Unicode classes",
    "(?<": "named groups and look-behinds",
    "*+": "possessive quantifiers",
    "++": "possessive quantifiers",
    "?+": "possessive quantifiers",
    "\\Z": "end anchors",
    "\\z": "end anchors",
    "\\h": "Java's horizontal space",
    "\\R": "Java's line break",
}


class ContractError(SchemasError, ValueError):
    """A contract file Loopline cannot take; the message names the file, the field and what to change."""


class Event(BaseModel):
    """Base of the record types derived from contracts: strict types, unknown fields ignored, immutable."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    #: The contract's name, in error messages ("invalid <name>: ...").
    RECORD_NAME: ClassVar[str] = ""
    #: Contracts are versioned by their registered copies, not by a field of every event.
    SCHEMA_VERSION: ClassVar[int | None] = None


#: Names a contract's fields cannot take: the records' own attributes (pydantic's, and the two above).
_RESERVED = frozenset(name for name in dir(Event) if not name.startswith("__"))


@dataclass(frozen=True)
class ContractField:
    """One field of a contract: its type, whether it may be absent or null, and its constraints."""

    name: str
    type: Literal["string", "boolean", "int", "long", "float", "double", "enum"]
    nullable: bool = False
    has_default: bool = False
    default: Any = None
    symbols: tuple[str, ...] = ()
    constraints: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""

    @property
    def required(self) -> bool:
        """Whether every event must carry the field (no null, no default)."""
        return not self.nullable and not self.has_default

    @property
    def sql_type(self) -> str:
        """The field's SQL type in the job and in Feast's DDL: STRING, BIGINT, DOUBLE or BOOLEAN."""
        return _SQL_TYPES[self.type]

    @property
    def numeric(self) -> bool:
        return self.type in ("int", "long", "float", "double")

    def spec(self) -> dict[str, Any]:
        """The field as the JVM decoder takes it (plain JSON)."""
        return {
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
            "hasDefault": self.has_default,
            "default": self.default,
            "symbols": list(self.symbols),
            "constraints": dict(self.constraints),
        }


@dataclass(frozen=True)
class EventContract:
    """A project's contract of one event type (module docstring), parsed from its Avro schema."""

    name: str
    fields: tuple[ContractField, ...]
    schema: Mapping[str, Any]
    source: str = "<inline>"

    def field(self, name: str) -> ContractField:
        """The field ``name``; KeyError naming the contract's fields when there is none."""
        for each in self.fields:
            if each.name == name:
                return each
        raise KeyError(f"{self.name} has no field {name!r}; its fields: {', '.join(f.name for f in self.fields)}")

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def column_types(self) -> dict[str, str]:
        """Each field's SQL type, in declaration order."""
        return {f.name: f.sql_type for f in self.fields}

    def ddl(self) -> str:
        """``name TYPE, ...``: the form Feast's ``JsonFormat(schema_json=...)`` takes."""
        return ", ".join(f"{name} {sql_type}" for name, sql_type in self.column_types().items())

    def avro_schema_json(self) -> str:
        """The Avro schema as JSON text: what Feast's ``AvroFormat(schema_json=...)`` takes."""
        return json.dumps(self.schema, sort_keys=True)

    def jvm_spec(self) -> str:
        """The contract as the job's JVM decoder takes it: its name, fields and Avro schema, as JSON."""
        return json.dumps({"name": self.name, "fields": [f.spec() for f in self.fields], "avroSchema": self.avro_schema_json()})

    def __getstate__(self) -> dict:
        """The contract without what is derived from it (rebuilt on first use): it travels to Flink's workers pickled,
        and a model class made at run time does not."""
        return {key: value for key, value in self.__dict__.items() if key not in ("record_type", "_avro")}

    @cached_property
    def record_type(self) -> type[Event]:
        """The pydantic model of one valid event (what :meth:`decode` returns, and what producers build)."""
        return _record_type(self)

    @cached_property
    def _avro(self):
        import fastavro

        return fastavro.parse_schema(dict(self.schema))

    def decode(self, payload: bytes | str, wire: WireFormat = "json") -> Event:
        """One event of ``payload`` in the ``wire`` format, validated; ContractViolation naming the field and the reason
        otherwise (``<payload>`` when the bytes are not an event at all). It never raises anything else."""
        data = _parse_json(self.name, payload) if wire == "json" else self._parse_avro(payload)
        try:
            return self.record_type.model_validate(data)
        except ValidationError as err:
            raise violation(self.record_type, err) from None

    def _parse_avro(self, payload: bytes | str) -> dict:
        import fastavro
        import fastavro.validation

        raw = payload.encode() if isinstance(payload, str) else payload
        buffer = io.BytesIO(raw)
        try:
            data = fastavro.schemaless_reader(buffer, self._avro, None)
        except Exception as err:  # truncated, an enum or union index out of range, text that is not UTF-8
            raise _whole(self.name, f"not valid Avro of this contract ({type(err).__name__}: {err})") from None
        if buffer.tell() != len(raw):
            raise _whole(self.name, f"{len(raw) - buffer.tell()} bytes after the Avro record")
        if not fastavro.validation.validate(data, self._avro, raise_errors=False):
            # fastavro reads a varint of any width; an Avro int beyond 32 bits (a long beyond 64) is no such value, and
            # the JVM's reader refuses those bytes as malformed.
            raise _whole(self.name, "a number outside its Avro type's range")
        if self.encode(data, "avro") != raw:
            # Avro writers write one form of a record (each number in its fewest bytes); a record in another is refused
            # on both sides alike, where Avro's readers would differ on it (a varint of more than ten bytes).
            raise _whole(self.name, "not the canonical Avro encoding of its record")
        return data

    def encode(self, event: Event | Mapping[str, Any], wire: WireFormat = "json") -> bytes:
        """The wire form of one event (a record of :attr:`record_type`, or its fields)."""
        data = event.model_dump() if isinstance(event, BaseModel) else dict(event)
        if wire == "json":
            return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        import fastavro

        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self._avro, {f.name: data.get(f.name, f.default) for f in self.fields})
        return buffer.getvalue()


def load_contract(path: Path) -> EventContract:
    """The contract in the Avro schema file at ``path``; ContractError naming the file and the problem."""
    try:
        schema = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ContractError(f"{path}: cannot read an Avro schema ({err})") from None
    return parse_contract(schema, str(path))


def parse_contract(schema: Mapping[str, Any], source: str = "<inline>") -> EventContract:
    """The contract of an Avro record schema (as parsed JSON); ContractError naming ``source`` and the problem."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        raise ContractError(f'{source}: a contract is an Avro record schema: {{"type": "record", "name": ..., "fields": [...]}}')
    name = schema.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ContractError(f"{source}: the record needs a name (letters, digits, underscores)")
    fields = tuple(_parse_field(source, raw) for raw in schema["fields"])
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ContractError(f"{source}: a field name appears twice")
    taken = sorted(name for name in names if name in _RESERVED or name.startswith("_"))
    if taken:
        raise ContractError(
            f"{source}: fields {taken} have names the event records use themselves (or start with an underscore); rename them"
        )
    try:  # Avro's own rules on the rest (enum symbols, defaults that fit their types), as Avro libraries apply them
        import fastavro

        fastavro.parse_schema(dict(schema))
    except Exception as err:
        raise ContractError(f"{source}: not a valid Avro schema ({err})") from None
    return EventContract(name, fields, dict(schema), source)


def _parse_field(source: str, raw: Any) -> ContractField:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not _NAME.fullmatch(raw["name"]):
        raise ContractError(f"{source}: every field needs a name (letters, digits, underscores): {raw!r:.80}")
    where = f"{source}, field '{raw['name']}'"
    kind, nullable = raw.get("type"), False
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1 or len(kind) != 2:
            raise ContractError(f'{where}: a union must be one type with null, e.g. ["null", "string"]')
        kind, nullable = others[0], True
    symbols: tuple[str, ...] = ()
    if isinstance(kind, Mapping) and kind.get("type") == "enum":
        symbols = tuple(kind.get("symbols") or ())
        kind = "enum"
    if kind not in (*_PRIMITIVES, "enum"):
        raise ContractError(
            f"{where}: type {kind!r} is not one Loopline takes ({', '.join(_PRIMITIVES)}, an enum, or one with null)"
        )
    constraints = dict(raw.get("constraints") or {})
    allowed = (
        _NUMBER_CONSTRAINTS if kind in ("int", "long", "float", "double") else _STRING_CONSTRAINTS if kind == "string" else {}
    )
    unknown = sorted(set(constraints) - set(allowed))
    if unknown:
        raise ContractError(f"{where}: constraints {unknown} do not apply to a {kind} (it takes {sorted(allowed) or 'none'})")
    for key, value in constraints.items():
        expected = str if key == "pattern" else int if key in ("minLength", "maxLength") else (int, float)
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ContractError(f"{where}: constraint {key} must be a {'text' if key == 'pattern' else 'number'}")
        if kind in _INTEGER_RANGE and key in _NUMBER_CONSTRAINTS:
            if isinstance(value, float) and not value.is_integer():
                raise ContractError(f"{where}: constraint {key} of an {kind} must be a whole number, not {value}")
            constraints[key] = int(value)
        if key == "pattern":
            try:
                re.compile(value)
            except re.error as err:
                raise ContractError(f"{where}: pattern {value!r} is not a regular expression ({err})") from None
            dialect = next((what for token, what in _DIALECT_ONLY.items() if token in value), None)
            if dialect is not None:
                raise ContractError(
                    f"{where}: pattern {value!r} uses {dialect}, which Python and Java read differently; "
                    "keep to classes, groups, alternation, quantifiers and anchors ^ $"
                )
    has_default = "default" in raw
    return ContractField(
        name=raw["name"],
        type=kind,
        nullable=nullable,
        has_default=has_default,
        default=raw.get("default"),
        symbols=symbols,
        constraints=constraints,
        doc=str(raw.get("doc", "")),
    )


def _record_type(contract: EventContract) -> type[Event]:
    """The pydantic model validating the contract's events, field by field in declaration order."""
    definitions: dict[str, Any] = {}
    for f in contract.fields:
        annotation: Any = {"string": str, "boolean": bool, "int": int, "long": int, "float": float, "double": float}.get(f.type)
        if f.type == "enum":
            annotation = Literal[f.symbols]  # type: ignore[valid-type]
        options: dict[str, Any] = {"description": f.doc or None}
        for key, value in f.constraints.items():
            if key in _NUMBER_CONSTRAINTS:
                options[_NUMBER_CONSTRAINTS[key]] = value
            elif key in ("minLength", "maxLength"):
                options[_STRING_CONSTRAINTS[key]] = value
        if f.type in _INTEGER_RANGE:
            annotation = Annotated[annotation, AfterValidator(_fits_integer(*_INTEGER_RANGE[f.type]))]
        if f.type in ("float", "double"):
            options["allow_inf_nan"] = False
            if f.type == "float":
                annotation = Annotated[annotation, AfterValidator(_fits_float32)]
        if "pattern" in f.constraints:
            annotation = Annotated[annotation, AfterValidator(_full_match(f.constraints["pattern"]))]
        if f.nullable:
            annotation = annotation | None
        default = f.default if f.has_default else None if f.nullable else ...
        definitions[f.name] = (annotation, Field(default, **options))
    model = create_model(contract.name, __base__=Event, **definitions)
    model.RECORD_NAME = contract.name
    return model


def _fits_integer(low: int, high: int):
    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"beyond a {64 if high > 2**31 else 32}-bit integer")
        return value

    return check


def _fits_float32(value: float) -> float:
    if abs(value) > _FLOAT32_MAX:
        raise ValueError("beyond a 32-bit float's range")
    return value


def _full_match(pattern: str):
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if compiled.fullmatch(value) is None:
            raise ValueError(f"does not match the pattern {pattern!r}")
        return value

    return check


def _whole(name: str, reason: str) -> ContractViolation:
    return ContractViolation(name, [FieldError(WHOLE_PAYLOAD, reason)])


def _reject_constant(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


class _Refused(ValueError):
    """Parsed JSON that no contract takes (too deep, or text that is not valid Unicode)."""


class _Object(dict):
    """A parsed JSON object, with how deep it nests, counted over every pair it was written with (a key given twice
    too, though the last value is the one kept): the job's decoder reads every token, so the rule is on the text."""

    depth = 1


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    parsed = _Object(pairs)
    for key, value in pairs:
        _check_text(key)
        parsed.depth = max(parsed.depth, 1 + _depth(value))
    if parsed.depth > MAX_JSON_DEPTH:
        raise _Refused(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return parsed


def _depth(value: Any) -> int:
    """How many levels of containers ``value`` is (0 for a scalar), checking its texts on the way."""
    if isinstance(value, _Object):
        return value.depth
    if isinstance(value, list):
        depth = 1 + max((_depth(item) for item in value), default=0)
        if depth > MAX_JSON_DEPTH:
            raise _Refused(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return depth
    if isinstance(value, str):
        _check_text(value)
    return 0


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # JSON lets a string escape half a UTF-16 pair ("\ud800"); such text cannot be written as UTF-8 again (a log
        # line, a Kafka record, a metric label), so no contract takes it.
        raise _Refused("text holds a lone UTF-16 surrogate (not valid Unicode)") from None


def _parse_json(name: str, payload: bytes | str) -> dict:
    """A JSON event's fields: the payload must be UTF-8, one strict JSON object (no NaN, nothing after it), at most
    ``MAX_JSON_DEPTH`` deep (the object is level 1), and every text valid Unicode; a key given twice takes its last
    value."""
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _whole(name, f"not UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        data = json.loads(payload, parse_constant=_reject_constant, object_pairs_hook=_object)
    except _Refused as err:
        raise _whole(name, str(err)) from None
    except RecursionError:
        raise _whole(name, "JSON nested too deeply") from None
    except ValueError as err:
        raise _whole(name, f"not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise _whole(name, f"expected a JSON object, got {type(data).__name__}")
    return data


def breaking_changes(old: EventContract, new: EventContract) -> list[str]:
    """Every way ``new`` breaks readers or events of ``old`` (Avro's full compatibility, and Loopline's constraints):
    a removed field that was required, an added field without a default, a changed type, a field made required, a
    removed enum symbol or one added where old readers would refuse it, a tightened or changed constraint. Empty when
    compatible both ways."""
    problems = []
    before, after = {f.name: f for f in old.fields}, {f.name: f for f in new.fields}
    for name in sorted(before.keys() - after.keys()):
        if before[name].required:
            problems.append(f"removed required field '{name}' (existing readers require it)")
    for name in sorted(after.keys() - before.keys()):
        if after[name].required:
            problems.append(f"added required field '{name}' without a default (events already written lack it)")
    for name in sorted(before.keys() & after.keys()):
        was, now = before[name], after[name]
        if was.type != now.type:
            problems.append(f"changed the type of field '{name}' ({was.type} -> {now.type})")
        elif was.symbols != now.symbols:
            problems.append(f"changed the symbols of enum field '{name}'")
        if was.required != now.required:
            problems.append(f"field '{name}' became {'required' if now.required else 'optional'}")
        elif was.nullable and not now.nullable:
            problems.append(f"field '{name}' may no longer be null (events already written may hold null)")
        if dict(was.constraints) != dict(now.constraints):
            problems.append(f"changed the constraints of field '{name}'")
    return problems
