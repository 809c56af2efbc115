"""Schema compatibility: refuse a change to a contract that would break existing readers.

A project's event contracts (``schemas/contracts.py``) are registered by copying each, as it is, under the
project's ``contracts/registered/``; a changed contract is compared with its registered copy by Avro's rules, both
ways (``contracts.breaking_changes``). A breaking change goes to a new topic with a contract of its own.

Loopline's own records: each record type's JSON Schema is registered (committed) under ``schemas/registered/`` per
schema version. A change to a model is compared with the registered schema of the same version:

* Old readers meet new records: removing a field they require, or changing any field's type
  or constraints, breaks them.
* New readers replay old records still in the log: a new required field (no default), or an
  optional field made required, breaks them.
* Adding an optional field (with a default) is safe both ways, because readers ignore fields
  they do not know.

A breaking change needs a new ``SCHEMA_VERSION`` (and readers that handle both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.contracts import breaking_changes as breaking_contract_changes
from schemas.contracts import load_contract
from schemas.errors import SchemasError
from schemas.project import Project
from schemas.records import RECORD_TYPES, Record

REGISTERED_SCHEMAS_DIR = Path(__file__).parent / "registered"
#: Under a project: where its registered contracts are kept.
REGISTERED_CONTRACTS = "contracts/registered"

#: JSON Schema keys that document a field without changing what values it accepts.
_DOCUMENTATION_KEYS = frozenset({"title", "description", "default", "examples"})


class CompatibilityError(SchemasError, ValueError):
    """A schema change breaks existing readers; ``problems`` names each break."""

    def __init__(self, record_name: str, problems: list[str]) -> None:
        self.record_name = record_name
        self.problems = problems
        super().__init__(f"breaking change to {record_name}: " + "; ".join(problems))


def json_schema(record_type: type[Record]) -> dict[str, Any]:
    """The JSON Schema of a record type, as registered."""
    return record_type.model_json_schema(mode="validation")


def _accepted_values(schema: Any) -> Any:
    """The part of a (sub)schema that decides which values are valid."""
    if isinstance(schema, dict):
        return {k: _accepted_values(v) for k, v in schema.items() if k not in _DOCUMENTATION_KEYS}
    if isinstance(schema, list):
        return [_accepted_values(v) for v in schema]
    return schema


def breaking_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every way ``new`` breaks readers or records of ``old`` (both JSON Schemas); empty if compatible."""
    old_fields, new_fields = old.get("properties", {}), new.get("properties", {})
    old_required, new_required = set(old.get("required", [])), set(new.get("required", []))
    problems: list[str] = []
    for name in sorted(old_fields.keys() - new_fields.keys()):
        if name in old_required:
            problems.append(f"removed required field '{name}' (existing readers require it)")
    for name in sorted(new_fields.keys() - old_fields.keys()):
        if name in new_required:
            problems.append(f"added required field '{name}' without a default (records already written lack it)")
    for name in sorted(old_fields.keys() & new_fields.keys()):
        if _accepted_values(old_fields[name]) != _accepted_values(new_fields[name]):
            problems.append(f"changed the type or constraints of field '{name}'")
        if (name in old_required) != (name in new_required):
            became = "required" if name in new_required else "optional"
            problems.append(f"field '{name}' became {became}")
    if _accepted_values(old.get("$defs", {})) != _accepted_values(new.get("$defs", {})):
        problems.append("changed a nested type definition")
    return problems


def check_compatible(record_name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise CompatibilityError if ``new`` would break readers or records of ``old``."""
    problems = breaking_changes(old, new)
    if problems:
        raise CompatibilityError(record_name, problems)


def registered_schema_path(record_type: type[Record], directory: Path = REGISTERED_SCHEMAS_DIR) -> Path:
    """Where the registered schema of this record type's current version lives."""
    return directory / f"{record_type.RECORD_NAME}.v{record_type.SCHEMA_VERSION}.json"


def check_registered_schemas(directory: Path = REGISTERED_SCHEMAS_DIR) -> dict[str, str]:
    """Compare every record type with its registered schema; raise CompatibilityError on a break.

    Returns, per record name, ``"unchanged"``, ``"compatible change"`` or ``"not registered"``.
    """
    outcome: dict[str, str] = {}
    for record_type in RECORD_TYPES:
        path = registered_schema_path(record_type, directory)
        if not path.exists():
            outcome[record_type.RECORD_NAME] = "not registered"
            continue
        old, new = json.loads(path.read_text()), json_schema(record_type)
        check_compatible(record_type.RECORD_NAME, old, new)
        outcome[record_type.RECORD_NAME] = "unchanged" if old == new else "compatible change"
    return outcome


def register_schemas(directory: Path = REGISTERED_SCHEMAS_DIR) -> list[Path]:
    """Write the current schema of every record type after checking it against what is registered."""
    check_registered_schemas(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for record_type in RECORD_TYPES:
        path = registered_schema_path(record_type, directory)
        path.write_text(json.dumps(json_schema(record_type), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def _registered_contract(project: Project, topic: str) -> Path:
    """Where the registered copy of ``topic``'s contract is kept: ``contracts/registered/<its file's name>``."""
    return project.path / REGISTERED_CONTRACTS / Path(project.spec.topics[topic].contract).name


def check_project_contracts(project: Project) -> dict[str, str]:
    """Compare each of the project's contracts with its registered copy; CompatibilityError on a break. Per contract
    file, ``"unchanged"``, ``"compatible change"`` or ``"not registered"``."""
    outcome: dict[str, str] = {}
    for topic, contract in project.contracts.items():
        path = _registered_contract(project, topic)
        if not path.exists():
            outcome[path.name] = "not registered"
            continue
        registered = load_contract(path)
        problems = breaking_contract_changes(registered, contract)
        if problems:
            raise CompatibilityError(f"{contract.name} ({topic})", problems)
        outcome[path.name] = "unchanged" if dict(registered.schema) == dict(contract.schema) else "compatible change"
    return outcome


def register_project_contracts(project: Project) -> list[Path]:
    """Copy each of the project's contracts as its registered copy, after checking every one against the copy there."""
    check_project_contracts(project)
    written = []
    for topic, contract in project.contracts.items():
        path = _registered_contract(project, topic)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(contract.schema), indent=2) + "\n")
        written.append(path)
    return written
