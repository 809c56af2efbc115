"""Compiling Feast stream feature views: what the engine computes, and clear errors for what it cannot."""

from __future__ import annotations

from datetime import timedelta

import pytest
from feast import Entity, FileSource, KafkaSource, StreamFeatureView
from feast.aggregation import Aggregation
from feast.data_format import JsonFormat
from feast.field import Field
from feast.types import Float32, Float64, Int64, String

from feature_store.config import repo_stream_views
from streams.feature_plan import PlanError, compile_plan, compile_view

USER = Entity(name="user", join_keys=["user_id"])


def view(*aggregations: Aggregation, topic: str = "events.transactions", name: str = "probe", dtype=None) -> StreamFeatureView:
    """A stream feature view of ``aggregations``, each feature Int64 for a count, else Float64, or all of ``dtype``."""
    source = KafkaSource(
        name=f"{name}_source",
        kafka_bootstrap_servers="localhost:9092",
        topic=topic,
        timestamp_field="event_time_ms",
        message_format=JsonFormat(schema_json="user_id string"),
        batch_source=FileSource(path="x.parquet", timestamp_field="event_timestamp"),
    )
    return with_join_key(
        StreamFeatureView(
            name=name,
            source=source,
            entities=[USER],
            timestamp_field="event_time_ms",
            aggregations=list(aggregations),
            schema=[Field(name=a.name, dtype=dtype or (Int64 if a.function == "count" else Float64)) for a in aggregations],
        ),
        "user_id",
    )


def with_join_key(feature_view: StreamFeatureView, join_key: str) -> StreamFeatureView:
    """What `feast apply` infers from the entity: the view's join key column."""
    feature_view.entity_columns = [Field(name=join_key, dtype=String)]
    return feature_view


def test_the_repository_views_compile() -> None:
    plan = compile_plan(repo_stream_views())
    user = next(v for v in plan.views if v.name == "user_transaction_features")
    assert user.entity_key == "user_id" and user.topic == "events.transactions"
    assert user.out_of_orderness_ms == 5_000
    count_5m = next(a for a in user.aggregations if a.name == "txn_count_5m")
    assert (count_5m.window_ms, count_5m.slide_ms, count_5m.window_buckets) == (300_000, 10_000, 30)


HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


@pytest.mark.parametrize(
    ("aggregation", "message"),
    [
        (Aggregation(name="p", function="percentile", column="amount", time_window=HOUR, slide_interval=MINUTE),
         "unsupported function 'percentile'"),
        (Aggregation(name="p", function="sum", column="currency", time_window=HOUR, slide_interval=MINUTE),
         "'sum' needs a numeric column"),
        (Aggregation(name="p", function="count", column="nope", time_window=HOUR, slide_interval=MINUTE),
         "column 'nope' is not a field"),
        (Aggregation(name="p", function="count", column="amount", time_window=HOUR, slide_interval=timedelta(minutes=7)),
         "slide_interval must be positive and divide"),
        (Aggregation(name="p", function="count", column="amount"), "needs a positive time_window"),
    ],
)  # fmt: skip
def test_unsupported_aggregations_are_refused_naming_the_view(aggregation: Aggregation, message: str) -> None:
    with pytest.raises(PlanError, match=message) as caught:
        compile_view(view(aggregation))
    assert "stream feature view 'probe'" in str(caught.value)


def test_a_float32_window_feature_is_refused() -> None:
    """A window's request-time values are 64-bit: a Float32 feature would read otherwise from the steps than Feast
    reads it."""
    probe = view(Aggregation(name="p", function="sum", column="amount", time_window=HOUR, slide_interval=MINUTE), dtype=Float32)
    with pytest.raises(PlanError, match="declare the feature 'p' Float64"):
        compile_view(probe)


def test_unknown_topic_is_refused() -> None:
    with pytest.raises(PlanError, match="no topic spec named 'elsewhere'"):
        compile_view(view(Aggregation(name="n", function="count", column="amount", time_window=HOUR), topic="elsewhere"))


def test_an_empty_feast_registry_is_a_clear_error() -> None:
    with pytest.raises(PlanError, match="run `loopline apply`"):
        compile_plan([])


def test_history_is_the_longest_window_the_features_read_plus_its_slide() -> None:
    """How far back a stream must start for every window of some features to be full: the request's own fields and
    time-since-previous have no window; a window of W in slides of S counts buckets up to W + S back."""
    plan = compile_plan(repo_stream_views())
    user = "user_transaction_features"
    minute, hour, day = 60_000, 3_600_000, 86_400_000
    assert plan.history_ms([f"{user}:txn_count_5m", "request:amount"]) == 5 * minute + 10_000
    assert plan.history_ms([f"{user}:txn_count_5m", f"{user}:amount_mean_1h"]) == hour + minute
    assert plan.history_ms([f"{user}:amount_max_24h", f"{user}:txn_count_5m"]) == day + 15 * minute
    assert plan.history_ms([f"{user}:secs_since_prev_txn", "request:amount", "no_view:txn_count_5m"]) == 0
    assert plan.history_ms(["merchant_transaction_features:merchant_txn_count_1h"]) == hour + minute
