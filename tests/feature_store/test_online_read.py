"""The fast read path returns exactly what Feast's get_online_features returns."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis

from feature_store.config import apply_definitions, feature_fields, feature_store
from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter
from feature_store.redis_connection import redis_client
from feature_store.view_state import PROGRESS, SERVING, Generation, views_key
from loopline.settings import Settings

USER_VIEW, MERCHANT_VIEW = "user_transaction_features", "merchant_transaction_features"


@pytest.fixture(scope="module")
def written(settings: Settings, stack) -> list[str]:
    apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    now_us = int(time.time() * 1e6)
    rows = []
    for i in range(40):
        features = {
            "txn_count_5m": i,
            "txn_count_1h": i + 1,
            "txn_count_24h": i + 2,
            "amount_sum_1h": i * 1.25,
            "amount_sum_24h": i * 2.5,
            "amount_mean_1h": i / 3,
            "amount_mean_24h": i / 7,
            "amount_max_24h": float(i),
            "distinct_merchants_1h": i % 5,
            "distinct_countries_24h": i % 3,
            "secs_since_prev_txn": None if i % 4 == 0 else i * 0.5,
        }
        rows.append(FeatureRow(USER_VIEW, f"read-u{i}", now_us - i, features))
    stale = dict(rows[0].features)
    rows.append(FeatureRow(USER_VIEW, "read-stale", now_us - 3 * 86_400 * 10**6, stale))  # past the 2-day TTL: still read
    rows.append(
        FeatureRow(
            MERCHANT_VIEW,
            "read-m1",
            now_us,
            {
                "merchant_txn_count_5m": 3,
                "merchant_txn_count_1h": 9,
                "merchant_amount_mean_1h": 12.5,
                "merchant_distinct_users_1h": 2,
            },
        )
    )
    assert writer.write(rows) == len(rows)
    return [f"read-u{i}" for i in range(40)]


@pytest.mark.parametrize("count", [1, 64])
def test_fast_read_equals_feast(settings: Settings, written: list[str], count: int) -> None:
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    users = (written + ["read-missing", "read-stale"] * 32)[:count]
    features = [f"{USER_VIEW}:{f.name}" for f in feature_fields(store.get_stream_feature_view(USER_VIEW))]
    rows = [{"user_id": u} for u in users]
    assert reader.get_online_features(features, rows) == store.get_online_features(features, rows).to_dict()


def test_fast_read_across_views_equals_feast(settings: Settings, written: list[str]) -> None:
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    features = [f"{USER_VIEW}:txn_count_5m", f"{USER_VIEW}:secs_since_prev_txn", f"{MERCHANT_VIEW}:merchant_amount_mean_1h"]
    rows = [{"user_id": written[3], "merchant_id": "read-m1"}, {"user_id": "read-stale", "merchant_id": "nope"}]
    got = reader.get_online_features(features, rows)
    assert got == store.get_online_features(features, rows).to_dict()
    assert got["txn_count_5m"] == [3, 0] and got["merchant_amount_mean_1h"] == [12.5, None]


def test_deleting_the_rows_lets_an_older_row_in_again(settings: Settings, written: list[str]) -> None:
    """What the demo does before its world's history: every row of the views goes, so a stream rebuilt from an hour
    ago writes rows older than the deleted ones (which the store would otherwise skip as not newer). Runs last here."""
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    features, rows = (
        [f"{USER_VIEW}:txn_count_5m", f"{MERCHANT_VIEW}:merchant_txn_count_5m"],
        [{"user_id": written[1], "merchant_id": "read-m1"}],
    )
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


def test_steps_are_written_with_their_row_and_read_at_request_time(settings: Settings, written: list[str]) -> None:
    """Real writer, reader and Redis: a row per event with its finished values and every window's steps (built from
    the window definition), written in batches, the newest first (the older rows are refused, steps included). A read
    without a time (from the steps) returns what Feast returns (from the finished values). Reads at request times
    from the latest event to a day after it equal the window definition for every windowed feature. A row without
    steps (written by hand) deletes them, and steps of another event time than the row's are not read: both read the
    row's finished values."""
    from tests.support.window_definition import steps_by_definition, window_by_definition

    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    layout = writer.layout.views[USER_VIEW]
    start = (int(time.time() * 1000) - 7_200_000) // 900_000 * 900_000
    offsets_s = [0, 4, 30, 70, 75, 600, 3_000, 3_660, 3_700, 5_400, 5_430, 5_431]
    events = [
        {
            "event_time_ms": start + s * 1000,
            "amount": round(1.5 + (i * 7.3) % 40, 2),
            "merchant_id": f"m{i % 3}",
            "country": "DE" if i % 4 else "FR",
        }
        for i, s in enumerate(offsets_s)
    ]
    rows = []
    for n in range(1, len(events) + 1):
        at = events[n - 1]["event_time_ms"]
        finished = {name: window_by_definition(a, events[:n], at) for name, a in layout.aggregations.items()}
        steps = {key: steps_by_definition(window, events[:n]) for key, (_, window) in layout.windows.items()}
        rows.append(FeatureRow(USER_VIEW, "read-steps", at * 1000, finished, n, steps))
    for batch in ([rows[-1]], rows[:4], rows[4:7], rows[7:-1]):
        writer.write(batch)
    client = redis.Redis(port=settings.redis.port)
    key = reader.layout.redis_key(("user_id",), ("read-steps",))
    for window_key, (steps_field, _) in layout.windows.items():
        assert client.hget(key, steps_field) == rows[-1].windows[window_key], "the newest row's steps stay"

    features = [f"{USER_VIEW}:{name}" for name in layout.aggregations]
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    without_time = reader.get_online_features(features, [{"user_id": "read-steps"}])  # the first step of each window
    assert without_time == store.get_online_features(features, [{"user_id": "read-steps"}]).to_dict()
    latest = events[-1]["event_time_ms"]
    reads = [
        latest - 60_000,
        latest,
        latest + 9_000,
        latest + 270_000,
        latest + 290_000,
        latest + 310_000,
        latest + 1_900_000,
        latest + 3_700_000,
        latest + 6_000_000,
        latest + 80_000_000,
        latest + 90_000_000,
    ]
    for at in reads:
        got = reader.read_with_row_times(features, [{"user_id": "read-steps"}], [at])[0]
        expected = {name: [window_by_definition(a, events, at)] for name, a in layout.aggregations.items()}
        assert {name: got[name] for name in layout.aggregations} == expected, at
    assert reader.read_with_row_times(features, [{"user_id": "read-steps"}], [latest + 90_000_000])[0]["txn_count_24h"] == [0]

    day_later = [latest + 86_400_000]
    by_hand = dataclasses.replace(rows[-1], events=rows[-1].events + 1, windows={})
    writer.write([by_hand])
    assert all(client.hget(key, steps_field) is None for steps_field, _ in layout.windows.values()), (
        "a row without steps deletes them"
    )
    got = reader.read_with_row_times(features, [{"user_id": "read-steps"}], day_later)[0]
    assert {name: got[name] for name in layout.aggregations} == {
        name: [value] for name, value in by_hand.features.items() if name in got
    }

    (steps_field, ten_s), *_ = layout.windows.values()
    client.hset(key, steps_field, steps_by_definition(ten_s, events[:-1]))  # steps of the row before: another event time
    assert reader.read_with_row_times([f"{USER_VIEW}:txn_count_5m"], [{"user_id": "read-steps"}], day_later)[0][
        "txn_count_5m"
    ] == [by_hand.features["txn_count_5m"]]


def test_bad_reads_and_writes_say_what_is_wrong(settings: Settings, written: list[str]) -> None:
    """An entity row without a view's join key is refused naming the key (read under an empty key, it would read no
    entity's row, silently); a view whose job published no progress has none (not 0, a lag of 56 years); a row with
    a feature its view does not compute is refused naming it."""
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    with pytest.raises(ValueError, match=f"no 'merchant_id', a join key of the view {MERCHANT_VIEW}"):
        reader.get_online_features(
            [f"{USER_VIEW}:txn_count_5m", f"{MERCHANT_VIEW}:merchant_txn_count_5m"], [{"user_id": written[0]}]
        )
    # The session's stack is shared: another module's feature job may have published progress in this database.
    blank_connection = f"{settings.redis_connection},db=9"
    blank = redis_client(blank_connection)
    key, serving = views_key(reader._project), Generation(USER_VIEW, 0, "no-progress-yet", "a plan", ("user_id",), ())
    blank.delete(key)
    blank.hset(key, SERVING + USER_VIEW, serving.to_json())
    assert OnlineReader(settings.feast_registry_path, blank_connection, settings.repo_path).progress_ms(USER_VIEW) is None
    blank.hset(key, PROGRESS + serving.namespace, "1234:5678")
    assert OnlineReader(settings.feast_registry_path, blank_connection, settings.repo_path).progress_ms(USER_VIEW) == 1234
    blank.delete(key)
    writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    with pytest.raises(ValueError, match=r"user_transaction_features: the rows readers serve .* hold no \['txn_count_7d'\]"):
        writer.write([FeatureRow(USER_VIEW, written[0], int(time.time() * 1e6), {"txn_count_7d": 1})])


@pytest.mark.parametrize("online_store", ["redis", None, {"type": "redis", "key_ttl_seconds": 60}])
def test_feast_s_shorthands_for_the_redis_store_read_the_serving_generations(settings: Settings, tmp_path, online_store) -> None:
    """``online_store: redis`` (Feast's shorthand), no ``online_store`` at all and a full entry all mean Loopline's
    Redis store, which reads each view's serving generation."""
    import yaml

    from feature_store.config import feast_config
    from feature_store.feast_online_store import STORE_TYPE

    raw = yaml.safe_load((settings.repo_path / "feature_store.yaml").read_text())
    raw["online_store"] = online_store
    (tmp_path / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    config = feast_config(None, settings.redis_connection, tmp_path)
    assert config.online_store.type == STORE_TYPE and config.online_store.connection_string == settings.redis_connection


def test_concurrent_refreshes_of_the_view_states_never_go_back(settings: Settings, written: list[str], monkeypatch) -> None:
    """A reader shared by threads (the scorer's) never goes back to states it has left: a refresh whose HGETALL is slow
    to answer must not land after, and replace, one another thread began later (readers would switch back to a plan
    they had left). Redis's answers are scripted here, the states' cache being what is tested."""
    import threading

    import feature_store.online_read as online_read

    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path, states_refresh_s=60)
    states = {
        number: online_read.ViewStates({USER_VIEW: Generation(USER_VIEW, number, USER_VIEW, f"plan-{number}", ("user_id",), ())})
        for number in (1, 2)
    }
    in_flight, reply = threading.Event(), threading.Event()
    answers = iter([(states[1], None), (states[1], reply), (states[2], None)])  # the second answer is slow to come

    def scripted_read(redis, project: str) -> online_read.ViewStates:
        answer, held_until = next(answers)
        if held_until is not None:
            in_flight.set()
            assert held_until.wait(10)
        return answer

    def serving() -> int:
        return reader.view_states().serving[USER_VIEW].number

    monkeypatch.setattr(online_read, "read_view_states", scripted_read)
    assert serving() == 1
    reader._states_read_at -= 60  # due again
    slow = threading.Thread(target=serving)
    slow.start()
    assert in_flight.wait(10)
    during = serving()  # generation 2 is in Redis now, but the slow refresh began first
    reply.set()
    slow.join(10)
    after = serving()
    assert during <= after, f"read generation {during}, then {after} again"
    reader._states_read_at -= 60
    assert serving() == 2 and serving() == 2


def test_before_the_first_read_of_the_view_states_concurrent_readers_wait_for_it(
    settings: Settings, written: list[str], monkeypatch
) -> None:
    """No reader serves without the states: while the first refresh is in flight, another caller waits for its answer
    (rather than reading every view as the registry defines it), and no second HGETALL is sent."""
    import threading

    import feature_store.online_read as online_read

    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    first = online_read.ViewStates({USER_VIEW: Generation(USER_VIEW, 3, USER_VIEW, "plan-3", ("user_id",), ())})
    in_flight, reply, calls = threading.Event(), threading.Event(), []

    def scripted_read(redis, project: str) -> online_read.ViewStates:
        calls.append(project)
        in_flight.set()
        assert reply.wait(10)
        return first

    monkeypatch.setattr(online_read, "read_view_states", scripted_read)
    seen: list[dict] = []
    threads = [threading.Thread(target=lambda: seen.append(dict(reader.view_states().serving))) for _ in range(2)]
    threads[0].start()
    assert in_flight.wait(10)
    threads[1].start()
    reply.set()
    for thread in threads:
        thread.join(10)
    assert seen == [dict(first.serving)] * 2 and len(calls) == 1, (seen, calls)


def test_the_asyncio_read_is_the_blocking_read(settings: Settings, written: list[str]) -> None:
    """The scorer's read (redis-py's asyncio client, on its event loop) returns what the blocking read returns for the
    same rows and times: the same plan and decoding, here with the second round trip for rows without steps and a
    missing entity."""
    import asyncio

    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    features = [f"{USER_VIEW}:txn_count_5m", f"{USER_VIEW}:amount_mean_24h", f"{USER_VIEW}:secs_since_prev_txn"]
    rows = [{"user_id": key} for key in [*written[:12], "nobody"]]
    at_ms = [int(time.time() * 1000)] * len(rows)

    async def read() -> object:
        try:
            return await reader.read_with_row_times_async(features, rows, at_ms)
        finally:
            await reader.aclose()

    blocking = reader.read_with_row_times(features, rows, at_ms)
    counts = blocking.values["txn_count_5m"]
    assert any(count is not None for count in counts[:-1]) and counts[-1] is None, counts
    assert asyncio.run(read()) == blocking
