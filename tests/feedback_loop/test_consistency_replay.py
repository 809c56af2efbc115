"""The consistency replay on the real stack catches an online path that computes one feature differently.

The feature job (real Flink, Kafka, Redis, Feast) runs from a registry of its own in which one window is one bucket
too long (`txn_count_5m` over 5 min 10 s): the job only, as a deployment that drifted from the registered definitions
would. What a scorer reads from the online store (the scorer's own read, values with their row times) is replayed by
the monitor's replay (`feedback_loop.consistency_replay`, which `loopline monitor` wires: the event log read back
from Kafka, judged as the job judges it, recomputed point in time from the registered definitions). That feature
shows value mismatches; every other feature, computed by the same job with the right windows, shows none.
(tests/loopline/test_demo_loop.py replays a healthy pipeline's own scored requests: no value mismatch either.)
"""

from __future__ import annotations

import copy
import json
import random
import time
import uuid
from pathlib import Path

import pytest

from feature_store.config import feature_store, parse_repo
from feature_store.online_read import OnlineReader
from feedback_loop.consistency import by_outcome, summary
from infra.service import wait_until
from loopline.components import feature_plan
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.monitoring import consistency_replay
from loopline.settings import Settings
from schemas import DeadLetterRecord, PredictionRecord
from schemas.topics import DAY_MS, TopicSpec
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent

VIEW = "user_transaction_features"
BROKEN = f"{VIEW}:txn_count_5m"
USERS, ROUNDS, EVENTS_PER_ROUND = 40, 5, 800
#: The events of each round span this much event time; the rounds follow one another and the last ends about now, so
#: nothing is late and 5-minute windows see several of a user's events.
ROUND_SPAN_MS = 200_000


def _drifted_feast_registry(settings: Settings, path: Path) -> Path:
    """A registry at ``path`` holding the repo's definitions, except `txn_count_5m` over one 10 s bucket more."""
    contents = parse_repo(settings.repo_path)
    views = copy.deepcopy(contents.stream_feature_views)  # the parsed objects are the repo module's own: left as they are
    window = next(a for view in views if view.name == VIEW for a in view.aggregations if a.name == "txn_count_5m")
    window.time_window += window.slide_interval
    store = feature_store(path, settings.redis_connection, settings.repo_path)
    store.apply([*contents.entities, *contents.data_sources, *contents.feature_views, *views])
    return path


def _events(topic: str, users: list[str], start_ms: int, round_index: int, rng: random.Random) -> list[Emitted]:
    """One round's events: ascending event times over the round's ROUND_SPAN_MS from ``start_ms``, users at random."""
    begins = start_ms + round_index * ROUND_SPAN_MS
    times = sorted(rng.randrange(begins, begins + ROUND_SPAN_MS) for _ in range(EVENTS_PER_ROUND))
    events = []
    for n, at in enumerate(times):
        user = rng.choice(users)
        event = TransactionEvent(
            schema_version=1,
            event_id=f"{user}-{round_index}-{n}",
            event_time_ms=at,
            user_id=user,
            merchant_id=f"m{rng.randrange(30)}",
            amount=round(rng.uniform(1, 300), 2),
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country=rng.choice(["DE", "FR", "NL"]),
        )
        events.append(Emitted(topic, user, FRAUD.encode(TRANSACTIONS.name, event), at, event))
    return events


@pytest.mark.timeout(600)
def test_a_job_with_one_window_off_by_a_bucket_shows_that_features_mismatch_and_no_other(
    applied: Settings, bootstrap: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    source = TopicSpec(f"test.consistency.{run}", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)
    dead = TopicSpec(f"test.consistency.{run}.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
    apply_topics(bootstrap, [source, dead])
    feast_registry = _drifted_feast_registry(applied, tmp_path / "drifted-registry.db")
    drifted = applied.model_copy(
        update={"feature_store": applied.feature_store.model_copy(update={"feast_registry_path": feast_registry})}
    )
    job = start_feature_job(
        drifted,
        tmp_path / "job.log",
        restore=False,
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: source.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=dead.name,
        LOOPLINE_STREAM__GROUP_ID=f"consistency-{run}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(tmp_path / "offline"),
    )
    # The scorer's read, of the registered definitions (the same views and features: only the job drifted).
    reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    features = [
        f"{VIEW}:{name}"
        for name in (
            "txn_count_5m",
            "txn_count_1h",
            "amount_sum_1h",
            "amount_mean_1h",
            "amount_max_24h",
            "distinct_merchants_1h",
            "distinct_countries_24h",
        )
    ]
    users = [f"drift-{run}-{n}" for n in range(USERS)]
    rng = random.Random(7)
    producer = EventProducer(bootstrap, client_config=applied.kafka.client_config)
    logged: list[PredictionRecord] = []
    start_ms = int(time.time() * 1000) - ROUNDS * ROUND_SPAN_MS
    try:
        for round_index in range(ROUNDS):
            events = _events(source.name, users, start_ms, round_index, rng)
            producer.publish(events)
            latest = {e.record.user_id: e.record.event_time_ms for e in events}
            seen = sorted(latest)

            def applied_round(seen: list[str] = seen, latest: dict[str, int] = latest) -> bool:
                row_times = reader.read_with_row_times(features[:1], [{"user_id": u} for u in seen]).row_times
                return row_times[VIEW] == [latest[u] for u in seen]

            assert wait_until(applied_round, 180 if round_index == 0 else 60, 0.2), (
                f"the job did not apply round {round_index}; see {tmp_path / 'job.log'}"
            )
            # Score every user of the round, as the scorer would (the values and the row's event time), as of the round's
            # end in event time: the next rounds' events come after it.
            as_of, now = start_ms + (round_index + 1) * ROUND_SPAN_MS, int(time.time() * 1000)
            values, row_times, *_ = reader.read_with_row_times(features, [{"user_id": u} for u in seen], [as_of] * len(seen))
            logged += [
                PredictionRecord(
                    schema_version=PredictionRecord.SCHEMA_VERSION,
                    request_id=f"{run}-{round_index}-{u}",
                    entity_keys={"user_id": u},
                    features={name: values[name.split(":", 1)[1]][i] for name in features},
                    defaulted_features=[],
                    model_name="m",
                    model_version="1",
                    score=0.5,
                    requested_at_ms=as_of,
                    scored_at_ms=now,
                    feature_row_times_ms={VIEW: row_times[VIEW][i]},
                )
                for i, u in enumerate(seen)
            ]
    finally:
        stop_process_group(job)

    report = consistency_replay(applied, feature_plan(applied).reading({TRANSACTIONS.name: source.name}))(logged)
    ratios = summary(report)
    assert ratios[BROKEN]["compared"] == len(logged) >= ROUNDS * USERS * 0.9
    # A user's events come ~10 s of event time apart: a window 10 s longer holds one more of them ~60 % of the time,
    # once the rounds reach back past 5 minutes (from the second on). The job stores that window's steps under its own
    # window length (310 s), which the registry's reader does not ask for: it returns the job's finished values.
    assert ratios[BROKEN]["mismatch_ratio"] > 0.3 and ratios[BROKEN]["smape"] > 0, ratios[BROKEN]
    assert {name: r["mismatch_ratio"] for name, r in ratios.items() if name != BROKEN} == dict.fromkeys(
        set(features) - {BROKEN}, 0.0
    )
    # Every row read was the latest (the test waited for it): nothing else to explain.
    healthy = by_outcome({name: c for name, c in report.items() if name != BROKEN})
    assert healthy["match"] == (len(features) - 1) * len(logged), healthy
