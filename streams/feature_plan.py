"""Compile a project's Feast stream feature views into a plan the Flink job and the offline recompute both run.

The plan is plain, picklable data: the topics the job reads (each with its contract, wire format, event time field
and allowed out-of-orderness) and, per view, its topic, its entity's join keys and its aggregations with their
windows in milliseconds. Anything the engine cannot compute is refused here, at compile time, naming the view and
what to change: a source over a topic the project does not declare, a format or a schema that is not the one its
contract derives, a join key or column the contract lacks, a feature declared with another type than its function
gives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from feature_store.window_tiles import SCALE, TILED_FUNCTIONS, AggregationSpec, millis
from schemas.contracts import EventContract
from schemas.project import Project
from streams.errors import StreamsError

if TYPE_CHECKING:  # importing Feast takes seconds; only its objects are handled here
    import pandas as pd
    from feast import StreamFeatureView

#: Functions the engine computes without a window: ``time_since_previous`` (seconds since the entity's previous
#: event) and ``last`` (the column's value in the entity's latest event that has one), both Loopline's own.
UNWINDOWED_FUNCTIONS = frozenset({"time_since_previous", "last"})
SUPPORTED_FUNCTIONS = TILED_FUNCTIONS | UNWINDOWED_FUNCTIONS
_NUMERIC_FUNCTIONS = frozenset({"sum", "mean", "max", "min"})
#: Functions whose state keeps the column's values themselves (as the JVM's String, Long, Double or Boolean).
_KEPT_VALUE_FUNCTIONS = frozenset({"count_distinct", "last"})
#: The largest magnitude an aggregated value may have: its integer of 1/SCALE stays exact in a double
#: (2**53), and over a thousand of them still sum within a 64-bit integer.
MAX_EXACT_VALUE = 2**53 / SCALE
#: The latest event time the engine takes (2255): row versions (microseconds) and the offline log's
#: timestamps (nanoseconds in pandas) stay within 64 bits.
MAX_EVENT_TIME_MS = 9_000_000_000_000
#: The Feast value type of each function's result (``last``: its column's, ``_LAST_TYPES``).
_RESULT_TYPES = {
    "count": "INT64",
    "count_distinct": "INT64",
    "sum": "DOUBLE",
    "mean": "DOUBLE",
    "max": "DOUBLE",
    "min": "DOUBLE",
    "time_since_previous": "DOUBLE",
}
_LAST_TYPES = {
    "string": "STRING",
    "enum": "STRING",
    "int": "INT64",
    "long": "INT64",
    "float": "DOUBLE",
    "double": "DOUBLE",
    "boolean": "BOOL",
}
_FEAST_TYPE_NAMES = {"INT64": "Int64", "DOUBLE": "Float64", "STRING": "String", "BOOL": "Bool"}


class PlanError(StreamsError, ValueError):
    """A feature view asks for something the streaming engine cannot compute."""


@dataclass(frozen=True)
class SourcePlan:
    """One topic the job reads: its events' contract and wire format, which field is their event time, and how far
    out of order they may come (the most any view over it allows)."""

    topic: str
    contract: EventContract
    wire: Literal["json", "avro"]
    time_field: str
    out_of_orderness_ms: int


@dataclass(frozen=True)
class ViewPlan:
    """What the job computes for one stream feature view."""

    name: str
    topic: str
    entity_keys: tuple[str, ...]
    time_field: str
    out_of_orderness_ms: int
    aggregations: tuple[AggregationSpec, ...]
    offline_path: str | None
    #: Each feature's Feast value type (INT64, DOUBLE, STRING or BOOL), as its function and column give it.
    value_types: Mapping[str, str] = field(default_factory=dict)
    #: The view's ``ttl`` (ms; 0: none): how far back ``time_since_previous`` and ``last`` look.
    ttl_ms: int = 0

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The view's features, in declaration order."""
        return tuple(a.name for a in self.aggregations)

    @property
    def last_columns(self) -> frozenset[str]:
        """The columns some ``last`` aggregation takes (kept as they are, None where an event has no value)."""
        return frozenset(a.column for a in self.aggregations if a.function == "last")

    @property
    def entity_key(self) -> str:
        """The column naming the entity in frames of the view's events: its join key, or for several join keys the
        column :meth:`with_entity` adds (each entity as the tuple of its join keys' values)."""
        return self.entity_keys[0] if len(self.entity_keys) == 1 else "(" + ",".join(self.entity_keys) + ")"

    def entity(self, keys: Mapping[str, str]) -> Hashable:
        """The entity named by ``keys`` (join key -> value) as :attr:`entity_key` holds it."""
        return keys[self.entity_keys[0]] if len(self.entity_keys) == 1 else tuple(keys[k] for k in self.entity_keys)

    def with_entity(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` (holding the join keys) with the :attr:`entity_key` column, when the view has several join keys."""
        if len(self.entity_keys) == 1 or self.entity_key in frame.columns:
            return frame
        values = list(zip(*(frame[key].tolist() for key in self.entity_keys), strict=True))
        import pandas as pd

        return frame.assign(**{self.entity_key: pd.Series(values, index=frame.index, dtype=object)})


@dataclass(frozen=True)
class FeaturePlan:
    """Every topic and view of the job."""

    sources: tuple[SourcePlan, ...]
    views: tuple[ViewPlan, ...]

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(source.topic for source in self.sources)

    def source(self, topic: str) -> SourcePlan:
        """The source reading ``topic``; KeyError naming the plan's topics when there is none."""
        for source in self.sources:
            if source.topic == topic:
                return source
        raise KeyError(f"the plan reads no topic {topic!r}; it reads {', '.join(self.topics)}")

    def identity(self, view: ViewPlan) -> str:
        """A digest of what ``view``'s window state means, which a checkpoint records and a restore checks
        (``streams/checkpoint_origin.py``): its topic, join keys and event time field; per aggregation, in order (the
        job keeps state by position), its function, column, window and slide, and the type of the values a distinct
        count or a last value keeps (the contract's SQL type of its column); and ``SCALE``, the unit totals are kept
        in. Feature names, lateness and the offline path are left out: state restored under other ones means the
        same."""
        contract = self.source(view.topic).contract
        aggregations = [
            [
                a.function,
                a.column,
                a.window_ms,
                a.slide_ms,
                contract.field(a.column).sql_type if a.function in _KEPT_VALUE_FUNCTIONS else None,
            ]
            for a in view.aggregations
        ]
        text = json.dumps([SCALE, view.topic, view.entity_keys, view.time_field, aggregations])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def rows_identity(self, view: ViewPlan) -> str:
        """A digest of what ``view``'s online rows mean: its window state's :meth:`identity` and the feature names the
        rows keep its values under, and, for a view with a feature without a window, its ``ttl`` (how far back those
        look). What the job's checkpoints record and check, what each row carries, and what
        tells one generation of the view's rows from the next (``feature_store/view_state.py``): under renamed
        features the state means the same, but the rows already written do not, so the job rebuilds them."""
        looking_back = [view.ttl_ms] if view.ttl_ms and any(a.window_ms is None for a in view.aggregations) else []
        text = json.dumps([self.identity(view), [a.name for a in view.aggregations], *looking_back])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def identities(self) -> dict[str, str]:
        """Each view's :meth:`rows_identity`, by name: what the job's checkpoints record and check."""
        return {view.name: self.rows_identity(view) for view in self.views}

    @property
    def out_of_orderness_ms(self) -> int:
        """The most any topic allows."""
        return max(source.out_of_orderness_ms for source in self.sources)

    @cached_property  # read for every event the recompute decodes (out_of_range)
    def range_fields(self) -> dict[str, tuple[str, ...]]:
        """Per topic, the fields some view over it sums, averages or takes the extremes of, in the contract's order."""
        aggregated = {
            (view.topic, a.column) for view in self.views for a in view.aggregations if a.function in _NUMERIC_FUNCTIONS
        }
        return {s.topic: tuple(name for name in s.contract.field_names if (s.topic, name) in aggregated) for s in self.sources}

    def out_of_range(self, topic: str, event: Mapping) -> tuple[str, str] | None:
        """(field, reason) when a valid event of ``topic`` holds a value the engine cannot aggregate exactly, else None
        (the event time first, then the aggregated numbers in the contract's order). The job dead-letters such an
        event (reason ``out_of_range``); the recompute leaves it out too."""
        time_field = self.source(topic).time_field
        if not 0 < event[time_field] <= MAX_EVENT_TIME_MS:
            return time_field, f"{event[time_field]} is beyond the latest event time the engine takes ({MAX_EVENT_TIME_MS})"
        for column in self.range_fields[topic]:
            if abs(event[column]) > MAX_EXACT_VALUE:
                return column, f"{event[column]:.6g} is beyond ±{MAX_EXACT_VALUE:.6g}, the largest value summed exactly"
        return None

    def history_ms(self, features: Iterable[str]) -> int:
        """How far back in event time the values of ``features`` (``view:feature``; others, such as request fields,
        are passed over) reach: the longest window among them plus its slide, the oldest bucket it still counts. A
        stream that starts this far back has every one of their windows full."""
        wanted = set(features)
        return max(
            (
                a.window_ms + a.slide_ms
                for view in self.views
                for a in view.aggregations
                if f"{view.name}:{a.name}" in wanted and a.window_ms is not None and a.slide_ms is not None
            ),
            default=0,
        )

    def lookback_ms(self, features: Iterable[str]) -> int | None:
        """How far back in event time the values of ``features`` (``view:feature``) reach, their features without a
        window too: the longest of :meth:`history_ms` and, for each feature without a window, its view's ttl (how far
        it looks back); None when such a feature's view has no ttl (it looks back the entity's whole history)."""
        wanted, reach = set(features), self.history_ms(features)
        for view in self.views:
            for a in view.aggregations:
                if f"{view.name}:{a.name}" in wanted and a.window_ms is None:
                    if not view.ttl_ms:
                        return None
                    reach = max(reach, view.ttl_ms)
        return reach

    def reading(self, topics: Mapping[str, str]) -> FeaturePlan:
        """The same plan reading other topics (``topics``: declared topic -> the topic to read, a replay or a test's)."""
        if not topics:
            return self
        unknown = sorted(set(topics) - set(self.topics))
        if unknown:
            raise PlanError(f"no view reads {', '.join(unknown)}; the plan reads {', '.join(self.topics)}")
        return FeaturePlan(
            tuple(replace(s, topic=topics.get(s.topic, s.topic)) for s in self.sources),
            tuple(replace(v, topic=topics.get(v.topic, v.topic)) for v in self.views),
        )

    def jvm_sources(self) -> str:
        """The sources as the job's JVM decoder takes them (``EventDecoder``), as JSON."""
        return json.dumps(
            [
                {
                    "topic": s.topic,
                    "wire": s.wire,
                    "contract": s.contract.jvm_spec(),
                    "timeField": s.time_field,
                    "outOfOrdernessMs": s.out_of_orderness_ms,
                    "rangeFields": list(self.range_fields[s.topic]),
                }
                for s in self.sources
            ]
        )


def _wire_format(view: str, topic: str, message_format, contract: EventContract) -> Literal["json", "avro"]:
    """The wire format a Kafka source's message format names, checked against the schema its contract derives."""
    kind = type(message_format).__name__
    schema = getattr(message_format, "schema_json", None)
    where = f"stream feature view '{view}', source over {topic}"
    if kind == "JsonFormat":
        if schema != contract.ddl():
            raise PlanError(
                f"{where}: its JsonFormat schema is not its contract's ({contract.source}); derive it: "
                f"JsonFormat(schema_json=load_contract(...).ddl()), which gives {contract.ddl()!r}"
            )
        return "json"
    if kind == "AvroFormat":
        try:
            declared = json.loads(schema or "")
        except ValueError:
            declared = None
        if declared != dict(contract.schema):
            raise PlanError(
                f"{where}: its AvroFormat schema is not its contract ({contract.source}); derive it: "
                "AvroFormat(schema_json=load_contract(...).avro_schema_json())"
            )
        return "avro"
    raise PlanError(f"{where}: message_format {kind} is not one Loopline decodes (JsonFormat or AvroFormat)")


def _compile_aggregation(
    view: str, contract: EventContract, aggregation, schema_fields: dict[str, str]
) -> tuple[AggregationSpec, str]:
    """One aggregation's spec and its Feast value type, or PlanError; ``schema_fields``: the view's features' declared
    value types by name."""
    function, column, name = aggregation.function, aggregation.column, aggregation.name
    where = f"stream feature view '{view}', aggregation '{name or function}'"
    if not name:
        raise PlanError(f"{where}: give the aggregation a name (it becomes the feature name)")
    if name not in schema_fields:
        raise PlanError(f"{where}: no field named '{name}' in the view's schema")
    if function not in SUPPORTED_FUNCTIONS:
        raise PlanError(f"{where}: unsupported function '{function}'; supported: {', '.join(sorted(SUPPORTED_FUNCTIONS))}")
    if column not in contract.field_names:
        raise PlanError(f"{where}: column '{column}' is not a field of {contract.name} ({', '.join(contract.field_names)})")
    declared = contract.field(column)
    if function in _NUMERIC_FUNCTIONS and not declared.numeric:
        raise PlanError(f"{where}: '{function}' needs a numeric column, '{column}' is a {declared.type}")
    if function in TILED_FUNCTIONS and not declared.required:
        raise PlanError(
            f"{where}: '{column}' may be null or absent in {contract.name}; a window aggregates required fields only "
            "(make it required in the contract, or take its last value)"
        )
    result = _LAST_TYPES[declared.type] if function == "last" else _RESULT_TYPES[function]
    if schema_fields[name] != result:
        raise PlanError(
            f"{where}: '{function}' of {declared.type} '{column}' gives {result}: declare the feature "
            f"Field(name='{name}', dtype={_FEAST_TYPE_NAMES[result]}), not {schema_fields[name]}"
        )
    if function in UNWINDOWED_FUNCTIONS:
        return AggregationSpec(name, function, column, None, None), result
    window, slide = millis(aggregation.time_window), millis(aggregation.slide_interval)
    if not window or window <= 0:
        raise PlanError(f"{where}: '{function}' needs a positive time_window")
    if not slide or slide <= 0 or window % slide != 0:
        raise PlanError(f"{where}: slide_interval must be positive and divide time_window ({window} ms)")
    return AggregationSpec(name, function, column, window, slide), result


def compile_view(view: StreamFeatureView, project: Project) -> tuple[ViewPlan, SourcePlan]:
    """The plan of one stream feature view, and of the source it reads, or PlanError naming the view and the problem."""
    source = view.stream_source
    if source is None or getattr(source, "kafka_options", None) is None:
        raise PlanError(f"stream feature view '{view.name}': needs a KafkaSource")
    topic = source.kafka_options.topic
    if topic not in project.contracts:
        raise PlanError(
            f"stream feature view '{view.name}': its source reads {topic!r}, which the project does not declare; add it "
            f"under topics: in {project.path / 'loopline_project.yaml'} with its contract"
        )
    contract = project.contracts[topic]
    wire = _wire_format(view.name, topic, source.kafka_options.message_format, contract)
    if wire != project.spec.topics[topic].format:
        raise PlanError(
            f"stream feature view '{view.name}': its source decodes {topic} as {wire}, the project declares "
            f"format {project.spec.topics[topic].format}"
        )
    time_field = source.timestamp_field
    if (
        time_field not in contract.field_names
        or contract.field(time_field).type != "long"
        or not contract.field(time_field).required
    ):
        raise PlanError(
            f"stream feature view '{view.name}': its source's timestamp_field '{time_field}' must be a required long "
            f"field of {contract.name} (epoch milliseconds)"
        )
    keys = tuple(column.name for column in view.entity_columns)
    if not keys:
        raise PlanError(f"stream feature view '{view.name}': needs an entity (its join keys name the entity in each event)")
    for key in keys:
        if key not in contract.field_names or contract.field(key).type != "string" or not contract.field(key).required:
            raise PlanError(
                f"stream feature view '{view.name}': join key '{key}' must be a required string field of "
                f"{contract.name} ({contract.source})"
            )
    if not view.aggregations:
        raise PlanError(f"stream feature view '{view.name}': declares no aggregations")
    schema_fields = {f.name: f.dtype.to_value_type().name for f in view.features}
    compiled = [_compile_aggregation(view.name, contract, a, schema_fields) for a in view.aggregations]
    delay = millis(source.kafka_options.watermark_delay_threshold or timedelta(0)) or 0
    batch = view.batch_source
    plan = ViewPlan(
        name=view.name,
        topic=topic,
        entity_keys=keys,
        time_field=time_field,
        out_of_orderness_ms=delay,
        aggregations=tuple(spec for spec, _ in compiled),
        offline_path=getattr(batch, "path", None),
        value_types={spec.name: value_type for spec, value_type in compiled},
        ttl_ms=millis(view.ttl) if view.ttl else 0,
    )
    return plan, SourcePlan(topic, contract, wire, time_field, delay)


def compile_plan(views: Iterable[StreamFeatureView], project: Project) -> FeaturePlan:
    """The plan for all ``views`` of ``project``: one job reads every topic they read (one checkpoint for all)."""
    compiled = sorted((compile_view(v, project) for v in views), key=lambda pair: pair[0].name)
    if not compiled:
        raise PlanError("the Feast registry has no stream feature views; run `loopline apply` first")
    sources: dict[str, SourcePlan] = {}
    for _, source in compiled:
        known = sources.get(source.topic)
        if known is not None and known.time_field != source.time_field:
            raise PlanError(
                f"the sources over {source.topic} take their event time from different fields "
                f"({known.time_field}, {source.time_field}); one topic has one event time"
            )
        if known is None or source.out_of_orderness_ms > known.out_of_orderness_ms:
            sources[source.topic] = source
    return FeaturePlan(tuple(sources[t] for t in sorted(sources)), tuple(view for view, _ in compiled))


def registered_plan(
    project: Project, feast_registry_path, redis_connection: str | None, topics: Mapping[str, str] | None = None
) -> FeaturePlan:
    """The plan compiled from the stream feature views in ``project``'s Feast registry (at ``feast_registry_path``;
    None: the one its feature_store.yaml names), reading ``topics`` (declared topic -> the topic to read) instead of
    their sources' where given."""
    from feature_store.config import feature_store

    views = feature_store(feast_registry_path, redis_connection, project.feature_repo).list_stream_feature_views()
    return compile_plan(views, project).reading(topics or {})
