"""The fraud project's real-time features: card holders' and merchants' recent transactions.

Window semantics (Loopline's): each aggregation covers the entity's events in the last ``time_window`` before the
request's time, counted in tiles of ``slide_interval`` (the oldest tile whole); the feature job updates them on every
event. Feast's own ``get_online_features`` returns them as of the entity's latest event; Loopline's scorer reads them
at each request's time. ``time_since_previous`` is Loopline's own function: seconds between the entity's latest event
and the one before it. Each feature declares the default the scorer uses when it has no value (the ``default`` tag):
0 for counts and amounts, -1 s for "no previous transaction".
"""

from datetime import timedelta
from pathlib import Path

from feast import Entity, FileSource, KafkaSource, RequestSource, StreamFeatureView
from feast.aggregation import Aggregation
from feast.data_format import JsonFormat, ParquetFormat
from feast.field import Field
from feast.types import Float64, Int64
from feast.value_type import ValueType

from schemas.contracts import load_contract

TRANSACTION = load_contract(Path(__file__).parents[1] / "contracts" / "transaction.avsc")

user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.STRING, description="A card holder.")
merchant = Entity(name="merchant", join_keys=["merchant_id"], value_type=ValueType.STRING, description="A merchant.")

#: What a score request carries beside its entities: the amount asked about.
transaction_request = RequestSource(name="transaction_request", schema=[Field(name="amount", dtype=Float64)])


def _transactions(view: str) -> KafkaSource:
    """The transactions topic; the view's feature rows are appended offline under data/offline/<view>."""
    return KafkaSource(
        name=f"transactions_for_{view}",
        kafka_bootstrap_servers="localhost:9092",
        topic="events.transactions",
        timestamp_field="event_time_ms",
        message_format=JsonFormat(schema_json=TRANSACTION.ddl()),
        watermark_delay_threshold=timedelta(seconds=5),
        batch_source=FileSource(
            name=f"{view}_offline", path=f"data/offline/{view}", file_format=ParquetFormat(), timestamp_field="event_timestamp"
        ),
    )


def _agg(name: str, function: str, column: str, window: timedelta, slide: timedelta) -> Aggregation:
    return Aggregation(name=name, function=function, column=column, time_window=window, slide_interval=slide)


FIVE_MIN, HOUR, DAY = timedelta(minutes=5), timedelta(hours=1), timedelta(days=1)
TEN_S, MINUTE, QUARTER = timedelta(seconds=10), timedelta(minutes=1), timedelta(minutes=15)

user_transaction_features = StreamFeatureView(
    name="user_transaction_features",
    source=_transactions("user_transaction_features"),
    entities=[user],
    ttl=timedelta(days=2),
    timestamp_field="event_time_ms",
    aggregations=[
        _agg("txn_count_5m", "count", "amount", FIVE_MIN, TEN_S),
        _agg("txn_count_1h", "count", "amount", HOUR, MINUTE),
        _agg("txn_count_24h", "count", "amount", DAY, QUARTER),
        _agg("amount_sum_1h", "sum", "amount", HOUR, MINUTE),
        _agg("amount_sum_24h", "sum", "amount", DAY, QUARTER),
        _agg("amount_mean_1h", "mean", "amount", HOUR, MINUTE),
        _agg("amount_mean_24h", "mean", "amount", DAY, QUARTER),
        _agg("amount_max_24h", "max", "amount", DAY, QUARTER),
        _agg("distinct_merchants_1h", "count_distinct", "merchant_id", HOUR, MINUTE),
        _agg("distinct_countries_24h", "count_distinct", "country", DAY, QUARTER),
        Aggregation(name="secs_since_prev_txn", function="time_since_previous", column="event_time_ms"),
    ],
    schema=[
        Field(name="txn_count_5m", dtype=Int64, tags={"default": "0"}),
        Field(name="txn_count_1h", dtype=Int64, tags={"default": "0"}),
        Field(name="txn_count_24h", dtype=Int64, tags={"default": "0"}),
        Field(name="amount_sum_1h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="amount_sum_24h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="amount_mean_1h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="amount_mean_24h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="amount_max_24h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="distinct_merchants_1h", dtype=Int64, tags={"default": "0"}),
        Field(name="distinct_countries_24h", dtype=Int64, tags={"default": "0"}),
        Field(name="secs_since_prev_txn", dtype=Float64, tags={"default": "-1.0"}),
    ],
    online=True,
    description="Velocity, spend and novelty of a card holder's recent transactions.",
)

merchant_transaction_features = StreamFeatureView(
    name="merchant_transaction_features",
    source=_transactions("merchant_transaction_features"),
    entities=[merchant],
    ttl=timedelta(days=2),
    timestamp_field="event_time_ms",
    aggregations=[
        _agg("merchant_txn_count_5m", "count", "amount", FIVE_MIN, TEN_S),
        _agg("merchant_txn_count_1h", "count", "amount", HOUR, MINUTE),
        _agg("merchant_amount_mean_1h", "mean", "amount", HOUR, MINUTE),
        _agg("merchant_distinct_users_1h", "count_distinct", "user_id", HOUR, MINUTE),
    ],
    schema=[
        Field(name="merchant_txn_count_5m", dtype=Int64, tags={"default": "0"}),
        Field(name="merchant_txn_count_1h", dtype=Int64, tags={"default": "0"}),
        Field(name="merchant_amount_mean_1h", dtype=Float64, tags={"default": "0.0"}),
        Field(name="merchant_distinct_users_1h", dtype=Int64, tags={"default": "0"}),
    ],
    online=True,
    description="Traffic and customer spread of a merchant.",
)
