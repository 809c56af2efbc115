"""Compile Feast stream feature views into a plan the Flink job and the offline recompute both run.

The plan is plain, picklable data: for each view the entity key, the source topic, the allowed
out-of-orderness and the aggregations with their windows in milliseconds. Anything the engine
cannot compute is refused here, at compile time, naming the view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.window_tiles import SCALE, TILED_FUNCTIONS, AggregationSpec, millis
from schemas.topics import TopicSpec, topic_spec

if TYPE_CHECKING:  # importing Feast takes seconds; only its objects are handled here
    from feast import StreamFeatureView

#: Functions the engine computes. ``time_since_previous`` is Loopline's own (no window).
SUPPORTED_FUNCTIONS = TILED_FUNCTIONS | {"time_since_previous"}
_NUMERIC_FUNCTIONS = frozenset({"sum", "mean", "max", "min"})
#: The largest magnitude an aggregated value may have: its integer of 1/SCALE stays exact in a double
#: (2**53), and over a thousand of them still sum within a 64-bit integer.
MAX_EXACT_VALUE = 2**53 / SCALE
#: The latest event time the engine takes (2255): row versions (microseconds) and the offline log's
#: timestamps (nanoseconds in pandas) stay within 64 bits.
MAX_EVENT_TIME_MS = 9_000_000_000_000


class PlanError(ValueError):
    """A feature view asks for something the streaming engine cannot compute."""


@dataclass(frozen=True)
class ViewPlan:
    """What the job computes for one stream feature view."""

    name: str
    entity_key: str
    topic: str
    out_of_orderness_ms: int
    aggregations: tuple[AggregationSpec, ...]
    offline_path: str | None

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The view's features, in declaration order."""
        return tuple(a.name for a in self.aggregations)


@dataclass(frozen=True)
class FeaturePlan:
    """Every view of the job; all of them read the same topic."""

    views: tuple[ViewPlan, ...]

    @property
    def topic(self) -> str:
        """The one source topic."""
        return self.views[0].topic

    @property
    def out_of_orderness_ms(self) -> int:
        """The job's watermark bound: the most any view allows."""
        return max(view.out_of_orderness_ms for view in self.views)

    @cached_property  # read for every event the job decodes (out_of_range)
    def numeric_columns(self) -> frozenset[str]:
        """The source columns some view sums, averages or takes the extremes of."""
        return frozenset(a.column for view in self.views for a in view.aggregations if a.function in _NUMERIC_FUNCTIONS)

    def out_of_range(self, event: dict, event_time: str = "event_time_ms") -> tuple[str, str] | None:
        """(field, reason) when a valid event holds a value the engine cannot aggregate exactly, else None.

        The job dead-letters such an event (reason ``out_of_range``); the recompute leaves it out too."""
        if not 0 < event[event_time] <= MAX_EVENT_TIME_MS:
            return event_time, f"{event[event_time]} is beyond the latest event time the engine takes ({MAX_EVENT_TIME_MS})"
        for column in self.numeric_columns:
            if abs(event[column]) > MAX_EXACT_VALUE:
                return column, f"{event[column]:.6g} is beyond ±{MAX_EXACT_VALUE:.6g}, the largest value summed exactly"
        return None

    def history_ms(self, features: Iterable[str]) -> int:
        """How far back in event time the values of ``features`` (``view:feature``; others, such as request fields,
        are passed over) reach: the longest window among them plus its slide, the oldest bucket it still counts. A
        stream that starts this far back has every one of their windows full."""
        wanted = set(features)
        return max((a.window_ms + a.slide_ms for view in self.views for a in view.aggregations
                    if f"{view.name}:{a.name}" in wanted and a.window_ms is not None and a.slide_ms is not None), default=0)  # fmt: skip

    def reading(self, topic: str) -> FeaturePlan:
        """The same plan with every view reading ``topic`` (a replay or a test topic)."""
        return FeaturePlan(tuple(replace(view, topic=topic) for view in self.views))


def _compile_aggregation(view: str, spec: TopicSpec, aggregation, schema_fields: dict[str, str]) -> AggregationSpec:
    """One aggregation's spec, or PlanError; ``schema_fields``: the view's features' value types by name."""
    function, column, name = aggregation.function, aggregation.column, aggregation.name
    where = f"stream feature view '{view}', aggregation '{name or function}'"
    if not name:
        raise PlanError(f"{where}: give the aggregation a name (it becomes the feature name)")
    if name not in schema_fields:
        raise PlanError(f"{where}: no field named '{name}' in the view's schema")
    if function not in SUPPORTED_FUNCTIONS:
        raise PlanError(f"{where}: unsupported function '{function}'; supported: {', '.join(sorted(SUPPORTED_FUNCTIONS))}")
    columns = spec.record_type.model_fields
    if column not in columns:
        raise PlanError(f"{where}: column '{column}' is not a field of {spec.record_type.__name__}")
    if function in _NUMERIC_FUNCTIONS and columns[column].annotation not in (int, float):
        raise PlanError(f"{where}: '{function}' needs a numeric column, '{column}' is not")
    window, slide = millis(aggregation.time_window), millis(aggregation.slide_interval)
    if function == "time_since_previous":
        return AggregationSpec(name, function, column, None, None)
    if not window or window <= 0:
        raise PlanError(f"{where}: '{function}' needs a positive time_window")
    if not slide or slide <= 0 or window % slide != 0:
        raise PlanError(f"{where}: slide_interval must be positive and divide time_window ({window} ms)")
    if schema_fields[name] == "FLOAT":
        # A window's values at request time come from its steps, which hold 64-bit numbers: a Float32 feature
        # would read otherwise than Feast reads its stored value.
        raise PlanError(f"{where}: declare the feature '{name}' Float64 (or Int64 for a count), not Float32")
    return AggregationSpec(name, function, column, window, slide)


def compile_view(view: StreamFeatureView) -> ViewPlan:
    """The plan of one stream feature view, or PlanError naming the view and the problem."""
    source = view.stream_source
    if source is None or getattr(source, "kafka_options", None) is None:
        raise PlanError(f"stream feature view '{view.name}': needs a KafkaSource")
    try:
        spec = topic_spec(source.kafka_options.topic)
    except KeyError as err:
        raise PlanError(f"stream feature view '{view.name}': {err.args[0]}") from None
    keys = [column.name for column in view.entity_columns]
    if len(keys) != 1:
        raise PlanError(f"stream feature view '{view.name}': needs exactly one entity join key, has {keys}")
    if keys[0] not in spec.record_type.model_fields:
        raise PlanError(f"stream feature view '{view.name}': join key '{keys[0]}' is not in {spec.name}")
    if not view.aggregations:
        raise PlanError(f"stream feature view '{view.name}': declares no aggregations")
    schema_fields = {field.name: field.dtype.to_value_type().name for field in view.features}
    delay = source.kafka_options.watermark_delay_threshold or timedelta(0)
    batch = view.batch_source
    return ViewPlan(
        name=view.name,
        entity_key=keys[0],
        topic=spec.name,
        out_of_orderness_ms=millis(delay) or 0,
        aggregations=tuple(_compile_aggregation(view.name, spec, a, schema_fields) for a in view.aggregations),
        offline_path=getattr(batch, "path", None),
    )


def compile_plan(views: Iterable[StreamFeatureView]) -> FeaturePlan:
    """The plan for all ``views``; they must read one topic (one Flink source)."""
    plans = tuple(sorted((compile_view(v) for v in views), key=lambda p: p.name))
    if not plans:
        raise PlanError("the Feast registry has no stream feature views; run `loopline apply` first")
    topics = {p.topic for p in plans}
    if len(topics) != 1:
        raise PlanError(f"stream feature views read several topics ({', '.join(sorted(topics))}); one job reads one")
    return FeaturePlan(plans)


def registered_plan(
    feast_registry_path: Path | None, redis_connection: str | None, repo_path: Path | None = None, source_topic: str | None = None
) -> FeaturePlan:
    """The plan compiled from the stream feature views in the Feast registry at ``feast_registry_path`` (None: the one the
    repo's feature_store.yaml names) of the repo at ``repo_path`` (None: feature_store/repo), reading ``source_topic``
    instead of their source's when given."""
    from feature_store.config import REPO_PATH, feature_store

    plan = compile_plan(feature_store(feast_registry_path, redis_connection, repo_path or REPO_PATH).list_stream_feature_views())
    return plan.reading(source_topic) if source_topic else plan
