"""The fast read path returns exactly what Feast's get_online_features returns."""

from __future__ import annotations

import time

import pytest

from feature_store.config import apply_definitions, feature_fields, feature_store
from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter
from loopline.settings import Settings

USER_VIEW, MERCHANT_VIEW = "user_transaction_features", "merchant_transaction_features"


@pytest.fixture(scope="module")
def written(settings: Settings, stack) -> list[str]:
    apply_definitions(settings.feast_registry_path, settings.redis_connection)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection)
    now_us = int(time.time() * 1e6)
    rows = []
    for i in range(40):
        features = {
            "txn_count_5m": i, "txn_count_1h": i + 1, "txn_count_24h": i + 2, "amount_sum_1h": i * 1.25,
            "amount_sum_24h": i * 2.5, "amount_mean_1h": i / 3, "amount_mean_24h": i / 7, "amount_max_24h": float(i),
            "distinct_merchants_1h": i % 5, "distinct_countries_24h": i % 3,
            "secs_since_prev_txn": None if i % 4 == 0 else i * 0.5,
        }  # fmt: skip
        rows.append(FeatureRow(USER_VIEW, f"read-u{i}", now_us - i, features))
    stale = dict(rows[0].features)
    rows.append(FeatureRow(USER_VIEW, "read-stale", now_us - 3 * 86_400 * 10**6, stale))  # past the 2-day TTL: still read
    rows.append(FeatureRow(MERCHANT_VIEW, "read-m1", now_us, {"merchant_txn_count_5m": 3, "merchant_txn_count_1h": 9,
                                                              "merchant_amount_mean_1h": 12.5,
                                                              "merchant_distinct_users_1h": 2}))  # fmt: skip
    assert writer.write(rows) == len(rows)
    return [f"read-u{i}" for i in range(40)]


@pytest.mark.parametrize("count", [1, 64])
def test_fast_read_equals_feast(settings: Settings, written: list[str], count: int) -> None:
    store = feature_store(settings.feast_registry_path, settings.redis_connection)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    users = (written + ["read-missing", "read-stale"] * 32)[:count]
    features = [f"{USER_VIEW}:{f.name}" for f in feature_fields(store.get_stream_feature_view(USER_VIEW))]
    rows = [{"user_id": u} for u in users]
    assert reader.get_online_features(features, rows) == store.get_online_features(features, rows).to_dict()


def test_fast_read_across_views_equals_feast(settings: Settings, written: list[str]) -> None:
    store = feature_store(settings.feast_registry_path, settings.redis_connection)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    features = [f"{USER_VIEW}:txn_count_5m", f"{USER_VIEW}:secs_since_prev_txn", f"{MERCHANT_VIEW}:merchant_amount_mean_1h"]
    rows = [{"user_id": written[3], "merchant_id": "read-m1"}, {"user_id": "read-stale", "merchant_id": "nope"}]
    got = reader.get_online_features(features, rows)
    assert got == store.get_online_features(features, rows).to_dict()
    assert got["txn_count_5m"] == [3, 0] and got["merchant_amount_mean_1h"] == [12.5, None]


def test_deleting_the_rows_lets_an_older_row_in_again(settings: Settings, written: list[str]) -> None:
    """What the demo does before its world's history: every row of the views goes, so a stream rebuilt from an hour
    ago writes rows older than the deleted ones (which the store would otherwise skip as not newer). Runs last here."""
    store = feature_store(settings.feast_registry_path, settings.redis_connection)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection)
    features, rows = [f"{USER_VIEW}:txn_count_5m", f"{MERCHANT_VIEW}:merchant_txn_count_5m"], [{"user_id": written[1], "merchant_id": "read-m1"}]
    assert reader.get_online_features(features, rows)["txn_count_5m"] == [1]
    older = FeatureRow(USER_VIEW, written[1], int(time.time() * 1e6) - 3_600 * 10**6, {"txn_count_5m": 99})
    writer.write([older])
    assert reader.get_online_features(features, rows)["txn_count_5m"] == [1], "an older row is skipped"

    assert writer.delete_rows() == [MERCHANT_VIEW, USER_VIEW]
    gone = reader.get_online_features(features, rows)
    assert gone == store.get_online_features(features, rows).to_dict()
    assert gone["txn_count_5m"] == [None] and gone["merchant_txn_count_5m"] == [None]
    writer.write([older])
    assert reader.get_online_features(features, rows)["txn_count_5m"] == [99], "the older row is the row now"
