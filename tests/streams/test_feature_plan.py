"""Compiling a project's Feast stream feature views: what the engine computes, and clear errors for what it cannot."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from feast import Entity, FileSource, KafkaSource, StreamFeatureView
from feast.aggregation import Aggregation
from feast.data_format import AvroFormat, JsonFormat
from feast.field import Field
from feast.types import Float32, Float64, Int64, String

from feature_store.config import repo_stream_views
from streams.feature_plan import PlanError, compile_plan, compile_view
from tests.support.templates import FRAUD, TRANSACTIONS

USER = Entity(name="user", join_keys=["user_id"])
MERCHANT = Entity(name="merchant", join_keys=["merchant_id"])
CONTRACT = FRAUD.contract(TRANSACTIONS.name)
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


def view(
    *aggregations: Aggregation,
    topic: str = TRANSACTIONS.name,
    name: str = "probe",
    dtype=None,
    message_format=None,
    entities=(USER,),
    timestamp_field: str = "event_time_ms",
) -> StreamFeatureView:
    """A stream feature view of ``aggregations``, each feature Int64 for a count, else Float64, or all of ``dtype``."""
    source = KafkaSource(
        name=f"{name}_source",
        kafka_bootstrap_servers="localhost:9092",
        topic=topic,
        timestamp_field=timestamp_field,
        message_format=message_format or JsonFormat(schema_json=CONTRACT.ddl()),
        batch_source=FileSource(path="x.parquet", timestamp_field="event_timestamp"),
    )
    feature_view = StreamFeatureView(
        name=name,
        source=source,
        entities=list(entities),
        timestamp_field=timestamp_field,
        aggregations=list(aggregations),
        schema=[
            Field(name=a.name, dtype=dtype or (Int64 if a.function in ("count", "count_distinct") else Float64))
            for a in aggregations
        ],
    )
    # What `feast apply` infers from the entities: the view's join key columns.
    feature_view.entity_columns = [Field(name=entity.join_key, dtype=String) for entity in entities]
    return feature_view


def test_the_fraud_templates_views_compile() -> None:
    plan = compile_plan(repo_stream_views(FRAUD.feature_repo), FRAUD)
    user = next(v for v in plan.views if v.name == "user_transaction_features")
    assert user.entity_keys == ("user_id",) and user.topic == TRANSACTIONS.name and user.time_field == "event_time_ms"
    assert plan.source(TRANSACTIONS.name).out_of_orderness_ms == 5_000 and plan.source(TRANSACTIONS.name).wire == "json"
    count_5m = next(a for a in user.aggregations if a.name == "txn_count_5m")
    assert (count_5m.window_ms, count_5m.slide_ms, count_5m.window_buckets) == (300_000, 10_000, 30)
    assert plan.range_fields == {TRANSACTIONS.name: ("amount",)}


@pytest.mark.parametrize(
    ("aggregation", "message"),
    [
        (
            Aggregation(name="p", function="percentile", column="amount", time_window=HOUR, slide_interval=MINUTE),
            "unsupported function 'percentile'",
        ),
        (
            Aggregation(name="p", function="sum", column="currency", time_window=HOUR, slide_interval=MINUTE),
            "'sum' needs a numeric column, 'currency' is a string",
        ),
        (
            Aggregation(name="p", function="count", column="nope", time_window=HOUR, slide_interval=MINUTE),
            "column 'nope' is not a field of transaction",
        ),
        (
            Aggregation(name="p", function="count", column="amount", time_window=HOUR, slide_interval=timedelta(minutes=7)),
            "slide_interval must be positive and divide",
        ),
        (Aggregation(name="p", function="count", column="amount"), "needs a positive time_window"),
    ],
)
def test_unsupported_aggregations_are_refused_naming_the_view(aggregation: Aggregation, message: str) -> None:
    with pytest.raises(PlanError, match=message) as caught:
        compile_view(view(aggregation), FRAUD)
    assert "stream feature view 'probe'" in str(caught.value)


def test_a_feature_declared_with_another_type_than_its_function_gives_is_refused_saying_which() -> None:
    """A window's request-time values are 64-bit (a Float32 would read otherwise from the steps than Feast reads it);
    a last value is of its column's type."""
    probe = view(Aggregation(name="p", function="sum", column="amount", time_window=HOUR, slide_interval=MINUTE), dtype=Float32)
    with pytest.raises(PlanError, match=r"gives DOUBLE: declare the feature Field\(name='p', dtype=Float64\)"):
        compile_view(probe, FRAUD)
    last = view(Aggregation(name="p", function="last", column="country"), dtype=Float64)
    with pytest.raises(PlanError, match=r"'last' of string 'country' gives STRING: .*dtype=String"):
        compile_view(last, FRAUD)


def test_a_last_value_and_a_composite_entity_compile() -> None:
    probe = view(
        Aggregation(name="last_country", function="last", column="country"),
        Aggregation(name="pair_count", function="count", column="amount", time_window=HOUR, slide_interval=MINUTE),
        entities=(USER, MERCHANT),
    )
    next(f for f in probe.features if f.name == "last_country").dtype = String  # by name: the schema's order is Feast's
    plan, _ = compile_view(probe, FRAUD)
    assert plan.entity_keys == ("user_id", "merchant_id") and plan.entity_key == "(user_id,merchant_id)"
    assert plan.value_types == {"last_country": "STRING", "pair_count": "INT64"}
    assert plan.entity({"merchant_id": "m", "user_id": "u"}) == ("u", "m")


def test_a_source_whose_schema_is_not_its_contracts_is_refused_with_the_fix() -> None:
    stale = view(
        Aggregation(name="n", function="count", column="amount", time_window=HOUR, slide_interval=MINUTE),
        message_format=JsonFormat(schema_json="user_id string, amount double"),
    )
    with pytest.raises(PlanError, match=r"JsonFormat\(schema_json=load_contract\(\.\.\.\)\.ddl\(\)\)"):
        compile_view(stale, FRAUD)
    avro = view(
        Aggregation(name="n", function="count", column="amount", time_window=HOUR, slide_interval=MINUTE),
        message_format=AvroFormat(schema_json=CONTRACT.avro_schema_json()),
    )
    with pytest.raises(PlanError, match=r"decodes events\.transactions as avro, the project declares format json"):
        compile_view(avro, FRAUD)


def test_a_topic_the_project_does_not_declare_is_refused() -> None:
    with pytest.raises(PlanError, match="reads 'elsewhere', which the project does not declare"):
        compile_view(view(Aggregation(name="n", function="count", column="amount", time_window=HOUR), topic="elsewhere"), FRAUD)


def test_a_join_key_or_time_the_contract_lacks_is_refused() -> None:
    nobody = Entity(name="nobody", join_keys=["nobody_id"])
    with pytest.raises(PlanError, match="join key 'nobody_id' must be a required string field of transaction"):
        compile_view(view(Aggregation(name="n", function="count", column="amount", time_window=HOUR), entities=(nobody,)), FRAUD)
    with pytest.raises(PlanError, match="timestamp_field 'amount' must be a required long field"):
        compile_view(
            view(Aggregation(name="n", function="count", column="amount", time_window=HOUR), timestamp_field="amount"), FRAUD
        )


def test_an_empty_feast_registry_is_a_clear_error() -> None:
    with pytest.raises(PlanError, match="run `loopline apply`"):
        compile_plan([], FRAUD)


def test_history_is_the_longest_window_the_features_read_plus_its_slide() -> None:
    """How far back a stream must start for every window of some features to be full: the request's own fields and
    time-since-previous have no window; a window of W in slides of S counts buckets up to W + S back."""
    plan = compile_plan(repo_stream_views(FRAUD.feature_repo), FRAUD)
    user = "user_transaction_features"
    minute, hour, day = 60_000, 3_600_000, 86_400_000
    assert plan.history_ms([f"{user}:txn_count_5m", "request:amount"]) == 5 * minute + 10_000
    assert plan.history_ms([f"{user}:txn_count_5m", f"{user}:amount_mean_1h"]) == hour + minute
    assert plan.history_ms([f"{user}:amount_max_24h", f"{user}:txn_count_5m"]) == day + 15 * minute
    assert plan.history_ms([f"{user}:secs_since_prev_txn", "request:amount", "no_view:txn_count_5m"]) == 0
    assert plan.history_ms(["merchant_transaction_features:merchant_txn_count_1h"]) == hour + minute
    # What a backfill reads: a feature without a window looks back its view's ttl (two days), or for ever without one.
    assert plan.lookback_ms([f"{user}:txn_count_5m"]) == 5 * minute + 10_000
    assert plan.lookback_ms([f"{user}:secs_since_prev_txn", f"{user}:amount_max_24h"]) == 2 * day
    users = next(view for view in plan.views if view.name == user)
    forever = dataclasses.replace(plan, views=tuple(dataclasses.replace(v, ttl_ms=0) if v is users else v for v in plan.views))
    assert forever.lookback_ms([f"{user}:secs_since_prev_txn"]) is None


def test_reading_other_topics_keeps_everything_else() -> None:
    plan = compile_plan(repo_stream_views(FRAUD.feature_repo), FRAUD)
    replay = plan.reading({TRANSACTIONS.name: "replay.transactions"})
    assert replay.topics == ("replay.transactions",) and {v.topic for v in replay.views} == {"replay.transactions"}
    with pytest.raises(PlanError, match="no view reads nowhere"):
        plan.reading({"nowhere": "x"})
