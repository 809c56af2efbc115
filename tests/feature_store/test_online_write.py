"""An online row is ordered by the events behind it, so a replay in another order never loses to a row written before.

The real ``SlidingWindows`` operator (PyFlink's mini-cluster, in this process) computes an entity's rows for a random
multiset of its events delivered in two orders: A, and B, which shares A's first ``c`` events (the checkpoint a job
restores) and delivers the rest in another order (the replay, its partitions interleaved anew). A's rows up to its
``p``-th event (``p >= c``: written before the failure), then B's rows after the checkpoint, go through the real
``OnlineWriter`` into Redis in random batches. Then rows arrive late, each of which the writer must reject: some of
A's rows again (rows of fewer events), and a row of the latest event time with one event fewer. The same late rows go
to a twin of each entity whose row Feast's own ``online_write_batch`` wrote (no order field: only a later event time
replaces it). Feast then reads the row of the whole multiset for both, stamped with its latest event time, and the
order field is still the whole multiset's (absent on the twin). The hash the writer leaves is the one Feast's own
store writes, plus the order field. Real Flink, Redis and Feast.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from feature_store.config import feature_store
from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter
from loopline.components import job_settings
from loopline.settings import Settings
from streams.feature_plan import FeaturePlan, ViewPlan, compile_plan
from tests.support.templates import FRAUD, TRANSACTIONS

START_MS = 1_790_000_000_000
COLUMNS = FRAUD.contract(TRANSACTIONS.name).column_types()
RUN = uuid.uuid4().hex[:6]


@dataclass(frozen=True)
class Delivery:
    """One entity's events (dicts of ``COLUMNS``) in order A and order B, A's checkpoint ``c`` and written prefix ``p``,
    the sizes of the write batches of each order's rows, and which of A's rows arrive again after the replay."""

    a: list[dict]
    b: list[dict]
    checkpoint: int
    written: int
    batches: list[int]
    late: list[int]


@st.composite
def _deliveries(draw: st.DrawFn, entity_key: str) -> Delivery:
    # Units that keep events in one window bucket, or spread them across the 5 min, 1 h and 24 h windows.
    unit = draw(st.sampled_from([1, 7_000, 240_000, 3_600_000]))
    other = "merchant_id" if entity_key == "user_id" else "user_id"
    event = st.fixed_dictionaries(
        {
            "event_time_ms": st.integers(0, 40).map(lambda t: START_MS + t * unit),
            other: st.sampled_from(["x", "y", "z"]),
            "amount": st.sampled_from([0.1, 0.2, 12.5, 999.99]),
            "country": st.sampled_from(["DE", "FR"]),
        }
    )
    events = draw(st.lists(event, min_size=1, max_size=30))
    a = draw(st.permutations(events))
    checkpoint = draw(st.integers(0, len(a)))
    written = draw(st.integers(checkpoint, len(a)))
    b = a[:checkpoint] + draw(st.permutations(a[checkpoint:]))
    batches = draw(st.lists(st.integers(1, 5), min_size=2 * len(a), max_size=2 * len(a)))
    late = draw(st.lists(st.integers(0, len(a) - 1), min_size=1, max_size=5))
    return Delivery(a, b, checkpoint, written, batches, late)


def _event(entity_key: str, entity: str, number: int, fields: dict) -> tuple:
    event = {
        "schema_version": 1,
        "event_id": f"e{number}",
        "user_id": "u",
        "merchant_id": "m",
        "currency": "EUR",
        "merchant_category": "grocery",
        "channel": "pos",
        **fields,
        entity_key: entity,
    }
    return tuple(event[name] for name in COLUMNS)


@pytest.fixture(scope="module")
def plan(applied: Settings) -> FeaturePlan:
    return compile_plan(
        feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path).list_stream_feature_views(), FRAUD
    )


@pytest.fixture(scope="module")
def windows(applied: Settings, plan: FeaturePlan, tmp_path_factory: pytest.TempPathFactory):
    """Runs the job's windows operator of a view over rows of events keyed by entity; each entity's rows, in order."""
    from pyflink.common import Row
    from pyflink.datastream.data_stream import DataStream

    from streams.feature_job import EVENT_POSITION, feature_columns, new_environment, row_type, windowed_rows

    checkpoints = tmp_path_factory.mktemp("row-order-checkpoints")

    def plan_of(view: ViewPlan):
        return plan.source(view.topic)

    settings = dataclasses.replace(job_settings(applied), checkpoint_dir=str(checkpoints), parallelism=1)

    def run(view: ViewPlan, events: list[tuple]) -> dict[str, list[dict]]:
        env = new_environment(settings)
        # Each event as the decoder hands it on: its contract's fields, then its log position (its number, in one partition).
        positioned = [Row(*event, 0, offset) for offset, event in enumerate(events)]
        source = env.from_collection(positioned, type_info=row_type({**COLUMNS, **EVENT_POSITION}))
        rows = DataStream(
            windowed_rows(source._j_data_stream, plan_of(view), view, plan.rows_identity(view), settings.state_check_ms)[0]
        )
        by_entity: dict[str, list[dict]] = {}
        names = list(feature_columns(view))
        with rows.execute_and_collect() as collected:
            for row in collected:
                by_entity.setdefault(row[0], []).append(dict(zip(names, row, strict=True)))
        return by_entity

    return run


@pytest.mark.parametrize("view_name", ["user_transaction_features", "merchant_transaction_features"])
def test_a_replay_in_another_order_ends_with_the_row_of_every_event(
    applied: Settings, plan: FeaturePlan, windows, view_name: str
) -> None:
    from feast.infra.online_stores.helpers import get_online_store_from_config

    view = next(v for v in plan.views if v.name == view_name)
    writer = OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    store = feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    feast_store = get_online_store_from_config(store.config.online_store)
    feast_view = store.get_stream_feature_view(view.name)
    reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    client = redis.Redis(host=applied.redis.host, port=applied.redis.port)
    layout = reader.layout.views[view.name]
    examples = iter(range(1_000))

    @hypothesis_settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(_deliveries(view.entity_key), min_size=1, max_size=8))
    def check(deliveries: list[Delivery]) -> None:
        example = next(examples)
        entities = [f"order-{RUN}-{view_name}-{example}-{i}" for i in range(len(deliveries))]
        events = [
            _event(view.entity_key, f"{entity}-{order}", n, fields)
            for entity, delivery in zip(entities, deliveries, strict=True)
            for order, ordered in (("a", delivery.a), ("b", delivery.b))
            for n, fields in enumerate(ordered)
        ]
        rows = windows(view, events)
        twins = [f"{entity}-feast" for entity in entities]
        feast_store.online_write_batch(
            store.config,
            feast_view,
            [_feast_row(view, feast_view, twin, rows[f"{entity}-b"][-1]) for entity, twin in zip(entities, twins, strict=True)],
            None,
        )
        for entity, twin, delivery in zip(entities, twins, deliveries, strict=True):
            a, b = rows[f"{entity}-a"], rows[f"{entity}-b"]
            assert [r["events"] for r in a] == [r["events"] for r in b] == list(range(1, len(delivery.a) + 1))
            assert _features(view, a[-1]) == _features(view, b[-1]), "the features are a function of the set of events"
            sent = a[: delivery.written] + b[delivery.checkpoint :]  # before the failure, then the replay
            batches = iter(delivery.batches)
            while sent:
                size = next(batches)
                writer.write([_row(view, entity, r) for r in sent[:size]])
                sent = sent[size:]
            final = b[-1]
            late = [_row(view, "", a[i]) for i in delivery.late]  # rows of fewer events, or A's last again
            late.append(FeatureRow(view.name, "", final["latest_ms"] * 1000, _features(view, a[0]), final["events"] - 1))
            for row in late:  # one write each: a batch would keep only its newest row of an entity
                for target in (entity, twin):
                    writer.write([dataclasses.replace(row, entity=target)])
        names = [f"{view.name}:{name}" for name in view.feature_names]
        finals = [rows[f"{entity}-b"][-1] for entity in entities] * 2
        online = store.get_online_features(names, [{view.entity_key: e} for e in entities + twins]).to_dict()
        for i, (entity, final) in enumerate(zip(entities + twins, finals, strict=True)):
            assert {name: online[name][i] for name in view.feature_names} == _features(view, final), entity
        assert reader.row_timestamps_us(view.name, [{view.entity_key: e} for e in entities + twins]) == [
            final["latest_ms"] * 1000 for final in finals
        ]
        orders = [client.hget(reader.layout.redis_key(view.entity_keys, (e,)), layout.order_field) for e in entities + twins]
        assert orders == [f"{f['latest_ms'] * 1000}:{f['events']}".encode() for f in finals[: len(entities)]] + [None] * len(
            twins
        )

    check()


def _features(view: ViewPlan, row: dict) -> dict:
    return {name: row[name] for name in view.feature_names}


def _row(view: ViewPlan, entity: str, row: dict) -> FeatureRow:
    return FeatureRow(view.name, entity, row["latest_ms"] * 1000, _features(view, row), row["events"])


def _feast_row(view: ViewPlan, feast_view, entity: str, row: dict) -> tuple:
    """The window operator's ``row`` of ``entity`` as Feast's ``online_write_batch`` takes it."""
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value
    from feast.type_map import python_values_to_proto_values

    key = EntityKey(join_keys=[view.entity_key], entity_values=[Value(string_val=entity)])
    types = {f.name: f.dtype.to_value_type() for f in feast_view.features}
    values = {name: python_values_to_proto_values([value], types[name])[0] for name, value in _features(view, row).items()}
    return key, values, datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=row["latest_ms"]), None


def test_the_hash_is_feasts_own_plus_the_order_and_absorbed_fields(applied: Settings) -> None:
    """What Feast's ``online_write_batch`` writes for a row, field by field and byte by byte, and two fields more."""
    from feast.infra.online_stores.helpers import get_online_store_from_config
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    store = feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    view = store.get_stream_feature_view("user_transaction_features")
    features = {"txn_count_5m": 3, "amount_sum_1h": 12.5, "secs_since_prev_txn": None, "distinct_merchants_1h": 2}
    values = {
        "txn_count_5m": Value(int64_val=3),
        "amount_sum_1h": Value(double_val=12.5),
        "secs_since_prev_txn": Value(),
        "distinct_merchants_1h": Value(int64_val=2),
    }
    at_us = START_MS * 1000 + 123
    ours, feasts = f"hash-{RUN}-ours", f"hash-{RUN}-feast"
    row = FeatureRow(view.name, ours, at_us, features, 7, absorbed="0:41,3:7")
    OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path).write([row])
    key = EntityKey(join_keys=["user_id"], entity_values=[Value(string_val=feasts)])
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=at_us)
    get_online_store_from_config(store.config.online_store).online_write_batch(
        store.config, view, [(key, values, at, None)], None
    )

    reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    client = redis.Redis(host=applied.redis.host, port=applied.redis.port)
    written = client.hgetall(reader.layout.redis_key(("user_id",), (ours,)))
    assert written.pop(f"_order:{view.name}".encode()) == f"{at_us}:7".encode()
    assert written.pop(f"_absorbed:{view.name}".encode()) == b"0:41,3:7"
    assert written == client.hgetall(reader.layout.redis_key(("user_id",), (feasts,)))
