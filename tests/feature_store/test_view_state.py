"""Features change: `loopline stream submit`, restored over a checkpoint of another plan, rebuilds the changed views
from the retained events into a new generation, and readers switch to it only once it is complete.

One private stack (its project's views are edited). The job runs, checkpoints and stops; the project then widens a
window, gives another window a new slide, replaces a distinct count's column and adds an aggregation; `feast apply`;
the job starts again over its checkpoint, while transactions of other entities go on arriving (a topic that is never
read to its end). Readers read all along, at one fixed time: every read gives, per view, either the previous plan's
exact values or the new plan's exact values (recomputed from the events by the window definition), never a mix, a
half-filled window, or an old value under a new name, and switches once.

Real Kafka, Redis, Flink (`loopline stream submit` subprocesses) and Feast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from feature_store.config import apply_definitions, feature_store
from feature_store.online_read import OnlineReader
from feedback_loop.consistency import features_at
from infra.service import wait_until
from loopline.components import feature_plan
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings
from streams.checkpoint_origin import recorded_plan
from streams.feature_plan import FeaturePlan, ViewPlan
from streams.flink_job import latest_checkpoint
from streams.producer import EventProducer
from streams.recompute import accepted_events, same_feature_value
from streams.topics import read_topic
from streams.world import Emitted
from tests.support.stack import private_stack, stack_settings
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent, fraud_world

#: The integration tier: a stack of its own, whose project it edits.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]
FAST_CHECKPOINTS = {"LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS": "1000"}
#: The four kinds of change, as edits of the fraud project's features.py: (what, text before, text after).
CHANGES = (
    (
        "a new slide",
        '_agg("txn_count_5m", "count", "amount", FIVE_MIN, TEN_S)',
        '_agg("txn_count_5m", "count", "amount", FIVE_MIN, timedelta(seconds=30))',
    ),
    (
        "a widened window",
        '_agg("merchant_txn_count_5m", "count", "amount", FIVE_MIN, TEN_S)',
        '_agg("merchant_txn_count_5m", "count", "amount", timedelta(minutes=10), TEN_S)',
    ),
    (
        "a replaced column",
        '_agg("merchant_distinct_users_1h", "count_distinct", "user_id", HOUR, MINUTE)',
        '_agg("merchant_distinct_users_1h", "count_distinct", "country", HOUR, MINUTE)',
    ),
    (
        "an added aggregation",
        '_agg("merchant_amount_mean_1h", "mean", "amount", HOUR, MINUTE),',
        '_agg("merchant_amount_mean_1h", "mean", "amount", HOUR, MINUTE),\n'
        '        _agg("merchant_amount_max_1h", "max", "amount", HOUR, MINUTE),',
    ),
    (
        "the added feature's field",
        'Field(name="merchant_amount_mean_1h", dtype=Float64, tags={"default": "0.0"}),',
        'Field(name="merchant_amount_mean_1h", dtype=Float64, tags={"default": "0.0"}),\n'
        '        Field(name="merchant_amount_max_1h", dtype=Float64, tags={"default": "0.0"}),',
    ),
)
ADDED = "merchant_transaction_features:merchant_amount_max_1h"


@dataclass
class Changed:
    """The module's stack after the job's first run under the template's plan."""

    settings: Settings
    before: FeaturePlan
    events: pd.DataFrame
    #: The one time every read is at (a second after the last event).
    at_ms: int
    logs: Path


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Changed]:
    home = tmp_path_factory.mktemp("plan-change")
    settings = stack_settings(home / "stack")
    with private_stack(settings):
        # Ten minutes of transactions, the last a minute ago: windows of 5 and 10 minutes, tiles of 10 and 30 s, tell
        # the plans apart.
        world = fraud_world(
            11,
            int(time.time() * 1000) - 660_000,
            rate_per_s=2,
            users=40,
            merchants=12,
            late_rate=0.0,
            malformed_rate=0.0,
            out_of_order_rate=0.05,
        )
        sent = _transactions(world, 1_200)
        EventProducer(settings.kafka.bootstrap).publish(sent)
        before = feature_plan(settings)
        events, _ = accepted_events(before, TRANSACTIONS.name, read_topic(settings.kafka.bootstrap, TRANSACTIONS.name))
        yield Changed(settings, before, events, int(events["event_time_ms"].max()) + 1_000, home / "logs")


def _transactions(world, count: int) -> list:
    """The first ``count`` transactions of ``world``."""
    taken = []
    for emitted in world:
        if emitted.topic == TRANSACTIONS.name and emitted.record is not None:
            taken.append(emitted)
            if len(taken) == count:
                return taken
    return taken


def _steady_transactions(bootstrap: str, stop: threading.Event, rate_per_s: float = 20.0) -> None:
    """Transactions stamped now, of four users and merchants no read asks for, at ``rate_per_s`` until ``stop``."""
    from confluent_kafka import Producer

    producer, n = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}), 0
    while not stop.wait(1 / rate_per_s):
        event = TransactionEvent(
            schema_version=1,
            event_id=f"steady-{n}",
            event_time_ms=int(time.time() * 1000),
            user_id=f"steady-u{n % 4}",
            merchant_id=f"steady-m{n % 4}",
            amount=10.0,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        producer.produce(TRANSACTIONS.name, FRAUD.encode(TRANSACTIONS.name, event), event.user_id)
        producer.poll(0)
        n += 1
    assert producer.flush(30) == 0


def _changed_plan(settings: Settings) -> FeaturePlan:
    """The project with ``CHANGES`` made (once) and applied: the plan the job compiles from it."""
    features_py = settings.repo_path / "features.py"
    text = features_py.read_text()
    if CHANGES[0][2] not in text:
        for what, old, new in CHANGES:
            assert text.count(old) == 1, what
            text = text.replace(old, new)
        features_py.write_text(text)
        apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    return feature_plan(settings)


def _switched(settings: Settings, plan: FeaturePlan, at_ms: int, log: Path) -> None:
    """Run the job, unless it ran, until every view's serving generation is ``plan``'s and has absorbed the events up
    to ``at_ms`` (a test run alone, without the one that rebuilds), then stop it."""
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path, states_refresh_s=0.1)

    def complete() -> bool:
        serving = reader.view_states().serving
        return all(
            getattr(serving.get(v.name), "identity", None) == plan.rows_identity(v) and (reader.progress_ms(v.name) or 0) >= at_ms
            for v in plan.views
        )

    if complete():
        return
    job = start_feature_job(settings, log, **FAST_CHECKPOINTS)
    try:
        assert wait_until(lambda: job.poll() is not None or complete(), 300, 0.5), log.read_text()[-3000:]
    finally:
        stop_process_group(job)


def _view(plan: FeaturePlan, name: str) -> ViewPlan:
    return next(view for view in plan.views if view.name == name)


def _expected(view: ViewPlan, events: pd.DataFrame, at_ms: int) -> dict[str, dict]:
    """Per entity, its features of ``view`` read at ``at_ms``, by the window definition over ``events``."""
    keys = sorted(events[view.entity_key].unique())
    read = features_at(view, events, pd.DataFrame({view.entity_key: keys, "at_ms": [at_ms] * len(keys)}))
    return {key: {a.name: read[(key, at_ms)][a.name] for a in view.aggregations} for key in keys}


def _agrees(expected: dict[str, dict], got: dict[str, list], keys: list[str], names: list[str]) -> bool:
    """Whether the read ``got`` (by feature, one entry per entity of ``keys``) is ``expected`` for every feature of
    ``names`` (a feature ``expected`` lacks must read None)."""
    return all(same_feature_value(name, expected[key].get(name), got[name][i]) for i, key in enumerate(keys) for name in names)


def test_a_changed_plan_rebuilds_and_readers_switch_once_complete(changed: Changed) -> None:
    settings, events, at_ms = changed.settings, changed.events, changed.at_ms
    before = {view.name: _expected(view, events, at_ms) for view in changed.before.views}
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)

    stale: list[dict] = []

    def reads(plan: FeaturePlan, view: ViewPlan) -> tuple[dict[str, list], list[str]]:
        keys = sorted(before[view.name])
        found = reader.read_with_row_times(
            [f"{view.name}:{n}" for n in _view(plan, view.name).feature_names],
            [{view.entity_key: k} for k in keys],
            [at_ms] * len(keys),
        )
        if found.read_as_of:
            stale.append(found.read_as_of)
        return found.values, keys

    job = start_feature_job(settings, changed.logs / "first.log", **FAST_CHECKPOINTS)
    try:

        def first_plan_complete() -> bool:
            return job.poll() is not None or all(
                _agrees(before[v.name], *reads(changed.before, v), list(v.feature_names)) for v in changed.before.views
            )

        assert wait_until(first_plan_complete, 240, 0.5) and job.poll() is None, f"see {changed.logs / 'first.log'}"
        done = latest_checkpoint(settings.checkpoint_dir)
        assert wait_until(lambda: latest_checkpoint(settings.checkpoint_dir) not in (None, done), 60, 0.2)
    finally:
        stop_process_group(job)
    restored = latest_checkpoint(settings.checkpoint_dir)
    assert recorded_plan(restored) == changed.before.identities()

    after = _changed_plan(settings)
    assert set(after.identities()) == set(changed.before.identities())
    assert all(after.identities()[v] != changed.before.identities()[v] for v in after.identities()), "both views changed"
    wanted = {view.name: _expected(view, events, at_ms) for view in after.views}
    merchants = _view(after, "merchant_transaction_features")
    # (The user view's new slide changes its state, not its values: windows are exact at the read time either way.)
    for name in ("merchant_txn_count_5m", "merchant_distinct_users_1h"):
        assert any(
            not same_feature_value(name, wanted[merchants.name][k][name], before[merchants.name][k][name])
            for k in before[merchants.name]
        ), f"{name}: the plans must give other values for the switch to be seen"

    # Readers under load while the job rebuilds: each read is one plan's exact values, and the plans follow once, in
    # each reader's own order (two threads' appends to one list interleave however the threads were scheduled).
    seen: list[dict[str, list[str]]] = []
    counted = {"old": 0, "new": 0}
    problems: list[str] = []
    stop = threading.Event()

    def read_all_along() -> None:
        mine: dict[str, list[str]] = {view.name: [] for view in after.views}
        seen.append(mine)
        while not stop.is_set():
            for view in after.views:
                got, keys = reads(after, view)
                names = list(view.feature_names)
                if _agrees(wanted[view.name], got, keys, names):
                    which = "new"
                elif _agrees(before[view.name], got, keys, names):
                    which = "old"
                else:
                    problems.append(f"{view.name}: a read of neither plan: {got}")
                    continue
                counted[which] += 1
                if not mine[view.name] or mine[view.name][-1] != which:
                    mine[view.name].append(which)

    stale.clear()  # the first run read stale while it caught up; the rebuild's reads are at a time both plans passed
    readers = [threading.Thread(target=read_all_along, daemon=True) for _ in range(2)]
    for thread in readers:
        thread.start()
    traffic = threading.Thread(target=_steady_transactions, args=(settings.kafka.bootstrap, stop), daemon=True)
    traffic.start()
    log = changed.logs / "second.log"
    job = start_feature_job(settings, log, **FAST_CHECKPOINTS)
    try:

        def switched() -> bool:
            serving = reader.view_states().serving
            return job.poll() is not None or all(serving[v.name].identity == after.rows_identity(v) for v in after.views)

        assert wait_until(switched, 300, 0.5) and job.poll() is None, log.read_text()[-3000:]
        time.sleep(1.0)  # reads after the switch, too (reader threads, not a wait for a condition)
        stop.set()
        for thread in [*readers, traffic]:
            thread.join(30)
        assert wait_until(lambda: recorded_plan(latest_checkpoint(settings.checkpoint_dir)) == after.identities(), 60, 0.5)
    finally:
        stop.set()
        stop_process_group(job)
    text = log.read_text()
    assert (
        "the views changed since the newest checkpoint" in text
        and "changed: merchant_transaction_features, user_transaction_features" in text
    ), text[-3000:]
    assert not problems, problems[:3]
    assert not stale, f"a read at a time the serving rows have passed is never stale: {stale[:1]}"
    assert len(seen) == 2 and all(mine["merchant_transaction_features"] == ["old", "new"] for mine in seen), seen
    assert min(counted.values()) > 20, f"reads before and after the switch: {counted}"
    users = [mine["user_transaction_features"] for mine in seen]
    assert all(order[-1] == "new" and len(order) <= 2 for order in users), seen
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    by_feast = store.get_online_features([ADDED], [{"merchant_id": k} for k in sorted(wanted[merchants.name])]).to_dict()
    assert by_feast["merchant_amount_max_1h"] == [
        wanted[merchants.name][k]["merchant_amount_max_1h"] for k in sorted(wanted[merchants.name])
    ], "Feast's own read follows the switch too"
    states = reader.view_states()
    assert {v: g.number for v, g in states.serving.items()} == {v.name: 1 for v in after.views} and not states.pending


def test_a_stopped_jobs_reads_are_read_as_of_its_progress_and_flagged_stale(changed: Changed) -> None:
    """The job the test above ran is stopped: once its progress is more than ``stale_after_s`` behind the clock, a read
    at a later time (where a five-minute window would read empty) is read as of the progress, exactly as the window
    definition gives it there, and the scorer's fetch names its features stale and sets the view's lag gauge."""
    import asyncio

    from prometheus_client import CollectorRegistry, Gauge

    from online.features import FeatureFetcher

    settings, events = changed.settings, changed.events
    reader = OnlineReader(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, stale_after_s=2.0, states_refresh_s=0.1
    )
    plan = feature_plan(settings)
    view = _view(plan, "merchant_transaction_features")
    if reader.progress_ms(view.name) is None:  # run alone: the job of the test above has not published any
        job = start_feature_job(settings, changed.logs / "progress.log", **FAST_CHECKPOINTS)
        try:
            assert wait_until(lambda: job.poll() is not None or reader.progress_ms(view.name) is not None, 240, 0.5)
        finally:
            stop_process_group(job)
    assert wait_until(lambda: time.time() * 1000 - reader.progress_ms(view.name) > 2_500, 30, 0.2), "the job is stopped"
    progress = reader.progress_ms(view.name)
    keys = sorted(events[view.entity_key].unique())
    later = int(time.time() * 1000) + 600_000
    found = reader.read_with_row_times(
        [f"{view.name}:{n}" for n in view.feature_names], [{view.entity_key: k} for k in keys], [later] * len(keys)
    )
    assert found.read_as_of == {view.name: [progress] * len(keys)}
    assert _agrees(_expected(view, events, progress), found.values, keys, list(view.feature_names))
    assert any(found.values["merchant_txn_count_5m"]), "read as of the progress, the windows still count events"
    unflagged = _expected(view, events, later)
    assert not any(unflagged[k]["merchant_txn_count_5m"] for k in keys), "read at the later time, they would count none"

    lag = Gauge("lag", "test", ["view"], registry=CollectorRegistry())
    fetcher = FeatureFetcher(reader, [f"{view.name}:merchant_txn_count_5m"], budget_s=5.0, view_lag=lag)

    async def fetch():
        try:
            return await fetcher.fetch({view.entity_key: keys[0]}, later)
        finally:
            await fetcher.close()

    fetched = asyncio.run(fetch())
    assert fetched.stale == [f"{view.name}:merchant_txn_count_5m"] and fetched.read_as_of_ms == {view.name: progress}
    assert lag.labels(view.name)._value.get() > 2.0


def test_a_feature_added_today_is_backfilled_into_a_snapshot_as_the_job_serves_it(changed: Changed) -> None:
    """A snapshot of labeled examples logged before ``merchant_amount_max_1h`` existed; `snapshot backfill` adds it,
    each example's value as of its request's time, recomputed from the retained events: exactly what the job's rows
    give a read at that time. The new snapshot extends the old one; a feature no view computes, or one the snapshot
    holds, is refused."""
    from feedback_loop.snapshots import SnapshotError, read_snapshot
    from loopline.retraining import backfill_snapshot, create_snapshot
    from schemas.records import TrainingExample

    settings, events, at_ms = changed.settings, changed.events, changed.at_ms
    after = _changed_plan(settings)
    _switched(settings, after, at_ms, changed.logs / "backfill-job.log")
    merchants = sorted(events["merchant_id"].unique())
    # Requests from the last event on: a read before an entity's latest event reads as of it, as the scorer does.
    requests = [(k, at_ms + offset) for k in merchants for offset in (0, 3_000_000, 3_300_000, 4_000_000)]
    now = int(time.time() * 1000)
    logged = [
        TrainingExample(
            schema_version=TrainingExample.SCHEMA_VERSION,
            event_id=f"backfill-{i}",
            request_id=f"request-{i}",
            entity_keys={"merchant_id": k, "user_id": "u000001"},
            features={"merchant_transaction_features:merchant_txn_count_5m": 1.0},
            model_name="fraud",
            model_version="1",
            score=0.5,
            label=float(i % 2),
            requested_at_ms=t,
            predicted_at_ms=t + 3,
            label_time_ms=t + 10,
            joined_at_ms=now,
        )
        for i, (k, t) in enumerate(requests)
    ]
    EventProducer(settings.kafka.bootstrap).publish(
        [Emitted(settings.feedback.examples_topic, e.event_id, e.model_dump_json().encode(), now, e) for e in logged]
    )
    taken = create_snapshot(settings, None, None)
    assert ADDED not in taken.features and taken.rows == len(requests)

    extended = backfill_snapshot(settings, taken.snapshot_id, [ADDED])
    assert extended.source["extends"] == taken.snapshot_id and extended.features == [*taken.features, ADDED]
    _, frame = read_snapshot(settings.snapshots_root, extended.snapshot_id)
    by_request = dict(zip(frame["request_id"], frame[ADDED], strict=True))
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path, stale_after_s=10**9)
    served = reader.read_with_row_times([ADDED], [{"merchant_id": k} for k, _ in requests], [t for _, t in requests]).values
    name, default = ADDED.split(":", 1)[1], reader.defaults[ADDED]
    # Where the rows give no value (an emptied window) the scorer would have used the declared default: so does the backfill.
    scored = [default if value is None else value for value in served[name]]
    assert default is not None and all(
        same_feature_value(name, by_request[e.request_id], value) for e, value in zip(logged, scored, strict=True)
    ), f"backfilled as the scorer reads the job's rows: {[by_request[e.request_id] for e in logged]} != {scored}"
    defaulted = dict(zip(frame["request_id"], frame["defaulted"], strict=True))
    assert [defaulted[e.request_id] for e in logged] == [int(value is None) for value in served[name]], "each default counted"

    by_merchant = [served[name][i : i + 4] for i in range(0, len(requests), 4)]
    assert any(len({v for v in values if v is not None}) > 1 for values in by_merchant), "values that tell request times apart"
    assert all(values[0] is not None and values[-1] is None for values in by_merchant), "every merchant's, and its emptied window"

    with pytest.raises(SnapshotError, match="already holds"):
        backfill_snapshot(settings, extended.snapshot_id, [ADDED])
    with pytest.raises(SnapshotError, match="no stream feature view computes 'merchant_transaction_features:nope'"):
        backfill_snapshot(settings, taken.snapshot_id, ["merchant_transaction_features:nope"])
