"""The delivery project's real-time features: how busy a restaurant and a zone are, and where couriers are.

Two topics: the orders (JSON, keyed by restaurant) and the couriers' locations (Avro, keyed by courier). Views are per
restaurant, per courier, per zone (an entity that is no topic's key: zones come from fields of both topics) and per
restaurant and zone together (a composite entity). A courier's last zone is a text feature; the model takes it raw.
Window semantics are Loopline's (see the fraud template, or docs/concepts/windows.md): each window covers the entity's events in
the last ``time_window`` before the request's time, in tiles of ``slide_interval``. Each feature declares the default
the scorer uses when it has no value (the ``default`` tag).
"""

from datetime import timedelta
from pathlib import Path

from feast import Entity, FileSource, KafkaSource, RequestSource, StreamFeatureView
from feast.aggregation import Aggregation
from feast.data_format import AvroFormat, JsonFormat, ParquetFormat
from feast.field import Field
from feast.types import Float64, Int64, String
from feast.value_type import ValueType

from schemas.contracts import load_contract

CONTRACTS = Path(__file__).parents[1] / "contracts"
ORDER = load_contract(CONTRACTS / "order.avsc")
COURIER_LOCATION = load_contract(CONTRACTS / "courier_location.avsc")

restaurant = Entity(name="restaurant", join_keys=["restaurant_id"], value_type=ValueType.STRING, description="A restaurant.")
courier = Entity(name="courier", join_keys=["courier_id"], value_type=ValueType.STRING, description="A courier.")
zone = Entity(name="zone", join_keys=["zone"], value_type=ValueType.STRING, description="A delivery zone of the city.")

#: What a score request carries beside its entities: the order's size, value and cuisine.
order_request = RequestSource(
    name="order_request",
    schema=[Field(name="items", dtype=Int64), Field(name="subtotal", dtype=Float64), Field(name="cuisine", dtype=String)],
)


def _offline(view: str) -> FileSource:
    """Where a view's feature rows are appended offline: data/offline/<view>."""
    return FileSource(
        name=f"{view}_offline", path=f"data/offline/{view}", file_format=ParquetFormat(), timestamp_field="event_timestamp"
    )


def _orders(view: str) -> KafkaSource:
    return KafkaSource(
        name=f"orders_for_{view}",
        kafka_bootstrap_servers="localhost:9092",
        topic="events.orders",
        timestamp_field="placed_at_ms",
        message_format=JsonFormat(schema_json=ORDER.ddl()),
        watermark_delay_threshold=timedelta(seconds=5),
        batch_source=_offline(view),
    )


def _locations(view: str) -> KafkaSource:
    return KafkaSource(
        name=f"courier_locations_for_{view}",
        kafka_bootstrap_servers="localhost:9092",
        topic="events.courier_locations",
        timestamp_field="pinged_at_ms",
        message_format=AvroFormat(schema_json=COURIER_LOCATION.avro_schema_json()),
        watermark_delay_threshold=timedelta(seconds=5),
        batch_source=_offline(view),
    )


def _agg(name: str, function: str, column: str, window: timedelta, slide: timedelta) -> Aggregation:
    return Aggregation(name=name, function=function, column=column, time_window=window, slide_interval=slide)


FIFTEEN_MIN, HOUR = timedelta(minutes=15), timedelta(hours=1)
FIVE_MIN, TEN_S, MINUTE = timedelta(minutes=5), timedelta(seconds=10), timedelta(minutes=1)

restaurant_features = StreamFeatureView(
    name="restaurant_features",
    source=_orders("restaurant_features"),
    entities=[restaurant],
    ttl=timedelta(days=1),
    timestamp_field="placed_at_ms",
    aggregations=[
        _agg("orders_15m", "count", "order_id", FIFTEEN_MIN, TEN_S),
        _agg("orders_1h", "count", "order_id", HOUR, MINUTE),
        _agg("items_15m", "sum", "items", FIFTEEN_MIN, TEN_S),
        _agg("mean_subtotal_1h", "mean", "subtotal", HOUR, MINUTE),
    ],
    schema=[
        Field(name="orders_15m", dtype=Int64, tags={"default": "0"}),
        Field(name="orders_1h", dtype=Int64, tags={"default": "0"}),
        Field(name="items_15m", dtype=Float64, tags={"default": "0.0"}),
        Field(name="mean_subtotal_1h", dtype=Float64, tags={"default": "0.0"}),
    ],
    online=True,
    description="How busy a restaurant's kitchen is.",
)

zone_order_features = StreamFeatureView(
    name="zone_order_features",
    source=_orders("zone_order_features"),
    entities=[zone],
    ttl=timedelta(days=1),
    timestamp_field="placed_at_ms",
    aggregations=[
        _agg("zone_orders_15m", "count", "order_id", FIFTEEN_MIN, TEN_S),
        _agg("zone_restaurants_1h", "count_distinct", "restaurant_id", HOUR, MINUTE),
    ],
    schema=[
        Field(name="zone_orders_15m", dtype=Int64, tags={"default": "0"}),
        Field(name="zone_restaurants_1h", dtype=Int64, tags={"default": "0"}),
    ],
    online=True,
    description="How many orders a zone asks for (the zone is no topic's key).",
)

restaurant_zone_features = StreamFeatureView(
    name="restaurant_zone_features",
    source=_orders("restaurant_zone_features"),
    entities=[restaurant, zone],
    ttl=timedelta(days=1),
    timestamp_field="placed_at_ms",
    aggregations=[_agg("pair_orders_1h", "count", "order_id", HOUR, MINUTE)],
    schema=[Field(name="pair_orders_1h", dtype=Int64, tags={"default": "0"})],
    online=True,
    description="Orders from one restaurant into one zone: a composite entity.",
)

courier_features = StreamFeatureView(
    name="courier_features",
    source=_locations("courier_features"),
    entities=[courier],
    ttl=timedelta(days=1),
    timestamp_field="pinged_at_ms",
    aggregations=[
        _agg("pings_5m", "count", "pinged_at_ms", FIVE_MIN, TEN_S),
        _agg("mean_speed_15m", "mean", "speed_kmh", FIFTEEN_MIN, MINUTE),
        Aggregation(name="last_zone", function="last", column="zone"),
        Aggregation(name="secs_since_ping", function="time_since_previous", column="pinged_at_ms"),
    ],
    schema=[
        Field(name="pings_5m", dtype=Int64, tags={"default": "0"}),
        Field(name="mean_speed_15m", dtype=Float64, tags={"default": "0.0"}),
        Field(name="last_zone", dtype=String, tags={"default": ""}),
        Field(name="secs_since_ping", dtype=Float64, tags={"default": "-1.0"}),
    ],
    online=True,
    description="Where a courier is and how fast it moves.",
)

zone_courier_features = StreamFeatureView(
    name="zone_courier_features",
    source=_locations("zone_courier_features"),
    entities=[zone],
    ttl=timedelta(days=1),
    timestamp_field="pinged_at_ms",
    aggregations=[_agg("couriers_15m", "count_distinct", "courier_id", FIFTEEN_MIN, MINUTE)],
    schema=[Field(name="couriers_15m", dtype=Int64, tags={"default": "0"})],
    online=True,
    description="How many couriers were seen in a zone lately.",
)
