"""A Loopline project: a folder a team owns, declaring its domain; read here into plain data.

    my-project/
      loopline_project.yaml   what Feast has no word for (below)
      feature_repo/           the Feast repo: feature_store.yaml, entities, Kafka sources, stream feature views,
                              request sources (``feast apply`` runs in it as in any Feast repo)
      contracts/*.avsc        one contract per event type (``schemas/contracts.py``)
      world.py                optional: a synthetic world for demos, tests and benchmarks

``loopline_project.yaml`` names the project's topics (each with its contract, its message key, partitions and
retention), its labels (topic, the label field, binary or numeric, the field joining a label to the prediction of
its event, the horizon), its model (name and inputs), the event a score request is about (so training history can
be backfilled from the event log), and optionally serving budgets, per-feature skew thresholds and a synthetic
world. Everything the engine needs to know about a domain is read from the folder once and handed to the parts as
plain data: the parts never import a project. A project is found as git finds its repository: the working
directory, or the nearest folder above it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.contracts import ContractError, EventContract, load_contract
from schemas.errors import SchemasError
from schemas.model_contract import REQUEST_PREFIX
from schemas.topics import TopicSpec

PROJECT_FILE = "loopline_project.yaml"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class ProjectError(SchemasError, ValueError):
    """A project folder Loopline cannot take; the message names the file, the entry and the fix."""


def duration_ms(text: str | int | float) -> int:
    """``"7d"``, ``"90s"``, ``"250ms"`` (or a number of seconds) in milliseconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text * 1000)
    match = _DURATION.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit (ms, s, m, h, d), e.g. 7d")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


def _checked_duration(text: str) -> str:
    duration_ms(text)
    return text


#: A duration as the project file writes it ("7d", "90s"), checked when read.
Duration = Annotated[str, AfterValidator(_checked_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopicDeclaration(_Strict):
    """One of the project's event topics."""

    contract: str = Field(description="The contract file of its events, relative to the project (contracts/<name>.avsc).")
    key: str = Field(description="The event field producers use as the message key (an entity's events in order).")
    format: Literal["json", "avro"] = Field(
        default="json",
        description="How its events are encoded: JSON objects, or Avro "
        "binary of the contract (a Kafka source over it says the same: JsonFormat, AvroFormat).",
    )
    partitions: int = Field(default=6, ge=1)
    retention: Duration = Field(
        default="7d", description="How long Kafka keeps its events: also how far back a rebuild can read."
    )


class LabelDeclaration(_Strict):
    """Where the outcomes of scored events come from, and what kind they are."""

    topic: str = Field(description="The topic of the label events (one of the project's topics).")
    joins_on: str = Field(description="The label field naming the scored event: a score request's event_id.")
    value: str = Field(description="The label field holding the outcome.")
    kind: Literal["binary", "numeric"] = Field(
        description="binary: a boolean outcome (classification); numeric: a number (regression)."
    )
    horizon: Duration = Field(default="7d", description="How long a prediction waits for its label; then it is unlabeled.")
    time: str | None = Field(
        default=None,
        description="The label field holding when the outcome was known (epoch ms); default: the label's Kafka timestamp.",
    )
    source: str | None = Field(
        default=None, description="A label field saying where the outcome came from (kept with the example)."
    )


class ScoredEventDeclaration(_Strict):
    """The event a score request is about: training history before any prediction was logged is backfilled from it."""

    topic: str = Field(description="The topic of the scored events.")
    id: str = Field(description="The event field a score request's event_id names (and labels join on).")
    request_fields: dict[str, str] = Field(default_factory=dict, description="request field -> the event field it is taken from.")


class ModelDeclaration(_Strict):
    """The model the project serves: its registered name and its inputs, in order."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    inputs: list[str] = Field(min_length=1, description="'view:feature' (the online store) and 'request:<field>' (the request).")
    first_model: dict[str, Any] | None = Field(
        default=None, description="A hand-set linear model served before any training: {weights: {input: weight}, bias: b}."
    )
    train_config: str | None = Field(default=None, description="The training config (YAML), relative to the project.")


class ServingDeclaration(_Strict):
    """Serving budgets the domain sets (settings may still override them)."""

    feature_budget_ms: float = Field(default=20.0, gt=0, description="Feature fetch budget; then defaults.")


class MonitoringDeclaration(_Strict):
    """How the skew monitor judges the project's features (settings may still override it, and check the values as
    they check ``monitor.feature_thresholds``)."""

    skew_thresholds: dict[str, dict[Literal["psi_warn", "psi_alert", "js_alert", "linf_alert"], float]] = Field(
        default_factory=dict,
        description="Per model input ('view:feature', 'request:<field>'): the thresholds it sets apart from the field's "
        "defaults (PSI 0.1 warn / 0.25 alert, JS and L-infinity 0.1 alert), where they do not fit the feature's shape.",
    )


class ProjectFile(_Strict):
    """The contents of ``loopline_project.yaml``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    feature_repo: str = Field(default="feature_repo", description="The Feast repo folder, relative to the project.")
    topics: dict[str, TopicDeclaration] = Field(min_length=1)
    labels: LabelDeclaration
    scored_event: ScoredEventDeclaration
    model: ModelDeclaration
    serving: ServingDeclaration = ServingDeclaration()
    monitoring: MonitoringDeclaration = MonitoringDeclaration()
    world: str | None = Field(default=None, description="A synthetic world for demos and tests: 'file.py:ClassName'.")
    demo: dict[str, Any] = Field(default_factory=dict, description="What `loopline demo` shows and injects (see the templates).")

    @model_validator(mode="after")
    def _topics_known(self) -> ProjectFile:
        for what, topic in (("labels.topic", self.labels.topic), ("scored_event.topic", self.scored_event.topic)):
            if topic not in self.topics:
                raise ValueError(f"{what} names {topic!r}, which is not among the project's topics ({', '.join(self.topics)})")
        unknown = sorted(set(self.monitoring.skew_thresholds) - set(self.model.inputs))
        if unknown:
            raise ValueError(
                f"monitoring.skew_thresholds names {', '.join(unknown)}, which the model does not take "
                f"(model.inputs: {', '.join(self.model.inputs)})"
            )
        return self


@dataclass(frozen=True)
class LabelPlan:
    """The label source as the feedback joiner and training take it."""

    topic: str
    contract: EventContract
    wire: Literal["json", "avro"]
    joins_on: str
    value: str
    kind: Literal["binary", "numeric"]
    horizon_ms: int
    time_field: str | None
    source_field: str | None


@dataclass(frozen=True)
class Project:
    """A loaded project: its folder, its file, and its contracts by topic."""

    path: Path
    spec: ProjectFile
    contracts: dict[str, EventContract]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def feature_repo(self) -> Path:
        """The Feast repo folder (its feature_store.yaml)."""
        return (self.path / self.spec.feature_repo).resolve()

    def contract(self, topic: str) -> EventContract:
        """The contract of ``topic``'s events; ProjectError naming the project's topics when it has none."""
        try:
            return self.contracts[topic]
        except KeyError:
            raise ProjectError(
                f"{self.path / PROJECT_FILE}: no topic {topic!r} (its topics: {', '.join(self.contracts)})"
            ) from None

    @cached_property
    def topics(self) -> tuple[TopicSpec, ...]:
        """The project's event topics, laid out as it declares."""
        return tuple(
            TopicSpec(
                name, self.contracts[name].record_type, key=t.key, partitions=t.partitions, retention_ms=duration_ms(t.retention)
            )
            for name, t in self.spec.topics.items()
        )

    @cached_property
    def labels(self) -> LabelPlan:
        """The label source, checked against its contract."""
        declared = self.spec.labels
        return LabelPlan(
            declared.topic,
            self.contract(declared.topic),
            self.spec.topics[declared.topic].format,
            declared.joins_on,
            declared.value,
            declared.kind,
            duration_ms(declared.horizon),
            declared.time,
            declared.source,
        )

    def encode(self, topic: str, event) -> bytes:
        """An event of ``topic`` (a record of its contract, or its fields) in the topic's wire format."""
        return self.contract(topic).encode(event, self.spec.topics[topic].format)

    def decoder(self, topic: str):
        """How ``topic``'s records are read: bytes to an event of its contract (ContractViolation when not one)."""
        contract, wire = self.contract(topic), self.spec.topics[topic].format
        return lambda payload: contract.decode(payload, wire)

    def resolve(self, relative: str) -> Path:
        """A path the project file names, relative to the project."""
        return (self.path / relative).resolve()


def load_project(path: Path) -> Project:
    """The project in the folder ``path`` (its ``loopline_project.yaml`` and contracts); ProjectError saying what is
    wrong and where."""
    path = Path(path).resolve()
    file = path / PROJECT_FILE
    if not file.is_file():
        raise ProjectError(
            f"{path} is not a Loopline project (no {PROJECT_FILE}); make one with "
            "`loopline init DIR --template NAME` (the templates: `loopline init --help`)"
        )
    try:
        spec = ProjectFile.model_validate(yaml.safe_load(file.read_text()) or {})
    except (ValidationError, yaml.YAMLError) as err:
        raise ProjectError(f"{file}: {err}") from None
    contracts = {}
    for topic, declared in spec.topics.items():
        try:
            contracts[topic] = load_contract(path / declared.contract)
        except ContractError as err:
            raise ProjectError(f"{file}, topic {topic}: {err}") from None
    project = Project(path, spec, contracts)
    _check_fields(project)
    return project


def _check_fields(project: Project) -> None:
    """Every event field the project file names is a field of the contract it names it in, of a fitting type."""
    file = project.path / PROJECT_FILE
    problems = []

    def check(what: str, topic: str, name: str | None, types: tuple[str, ...] | None = None, required: bool = False) -> None:
        if name is None:
            return
        contract = project.contracts[topic]
        if name not in contract.field_names:
            problems.append(f"{what} names {name!r}, not a field of {contract.name} ({contract.source})")
        elif types is not None and contract.field(name).type not in types:
            problems.append(
                f"{what}: field {name!r} of {contract.name} is a {contract.field(name).type}, not a {' or '.join(types)}"
            )
        elif required and contract.field(name).nullable:
            problems.append(f"{what}: field {name!r} of {contract.name} may be null; it must hold a value in every event")

    for topic, declared in project.spec.topics.items():
        check(f"topics.{topic}.key", topic, declared.key, ("string",), required=True)
    labels, scored = project.spec.labels, project.spec.scored_event
    check("labels.joins_on", labels.topic, labels.joins_on, ("string",), required=True)
    check(
        "labels.value",
        labels.topic,
        labels.value,
        ("boolean",) if labels.kind == "binary" else ("int", "long", "float", "double"),
        required=True,
    )
    check("labels.time", labels.topic, labels.time, ("long",), required=True)
    check("labels.source", labels.topic, labels.source, ("string", "enum"))
    check("scored_event.id", scored.topic, scored.id, ("string",), required=True)
    for request_field, event_field in scored.request_fields.items():
        check(f"scored_event.request_fields.{request_field}", scored.topic, event_field)
    # Training history is backfilled from the scored events: each request input of the model comes from one of its fields.
    unmapped = [
        name
        for name in project.spec.model.inputs
        if name.startswith(REQUEST_PREFIX) and name.removeprefix(REQUEST_PREFIX) not in scored.request_fields
    ]
    if unmapped:
        problems.append(
            f"model.inputs {unmapped} are request fields scored_event.request_fields does not take from the scored event"
        )
    if problems:
        raise ProjectError(f"{file}: " + "; ".join(problems))


def find_project(start: Path) -> Path | None:
    """The project folder holding ``start`` (it or the nearest folder above it with a ``loopline_project.yaml``), or None."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_FILE).is_file():
            return folder
    return None
