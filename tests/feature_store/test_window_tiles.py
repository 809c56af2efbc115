"""Windows decay at request time, on the real stack: a burst, then silence, then requests scored later.

The feature job (real Flink, Kafka, Redis, Feast) absorbs one user's burst of transactions hours ago, and an event
that arrives after a newer one (within the out-of-orderness bound) into an older tile. Nothing more happens. Requests
for the user, stamped later and later, are scored through the HTTP door with a real ONNX model, and each prediction
logs the windows the model saw: they equal the window definition over the events at the request's time, fall tile
by tile as the request time moves on, the late event counting for as long as its tile is the 5-minute window's tail,
and reach 0 once every window has passed. Feast's own ``get_online_features`` still returns the finished values, as
of the user's latest event.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests

from feature_store.config import feature_store
from feature_store.online_read import OnlineReader
from infra.service import wait_until
from loopline.components import feature_plan
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.serving import build_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from schemas import DeadLetterRecord, PredictionRecord, ScoreRequest, encode
from schemas.topics import DAY_MS, TopicSpec
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.scoring import serving_doors
from tests.support.templates import EVENT_TIME, TRANSACTIONS, TransactionEvent
from tests.support.window_definition import window_by_definition

VIEW = "user_transaction_features"
WINDOWED = (
    "txn_count_5m",
    "txn_count_1h",
    "txn_count_24h",
    "amount_sum_1h",
    "amount_mean_24h",
    "amount_max_24h",
    "distinct_merchants_1h",
    "distinct_countries_24h",
)
INPUTS = [f"{VIEW}:{name}" for name in WINDOWED]
SECOND, MINUTE, HOUR = 1_000, 60_000, 3_600_000


def _burst(user: str, start_ms: int) -> list[dict]:
    """Ten transactions over 40 s from ``start_ms`` (on an hour), one at +50 s, then one at +46 s (sent last: 4 s behind
    the newest, within the 5 s bound, in the 10 s tile before the newest one's)."""
    offsets = [n * 4 * SECOND for n in range(10)] + [50 * SECOND, 46 * SECOND]
    return [
        {
            "event_id": f"{user}-{n}",
            EVENT_TIME: start_ms + offset,
            "user_id": user,
            "merchant_id": f"m{n % 3}",
            "amount": 10.0 + n,
            "country": "DE" if n < 6 else "FR",
        }
        for n, offset in enumerate(offsets)
    ]


def _record(event: dict) -> TransactionEvent:
    return TransactionEvent(schema_version=1, currency="EUR", merchant_category="grocery", channel="pos", **event)


@pytest.mark.timeout(600)
def test_a_quiet_users_windows_empty_tile_by_tile_as_the_request_time_moves_on(applied: Settings, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    source = TopicSpec(f"test.decay.{run}", TransactionEvent, key="user_id", partitions=1, retention_ms=DAY_MS)
    dead = TopicSpec(f"test.decay.{run}.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
    apply_topics(applied.kafka.bootstrap, [source, dead])
    user = f"decay-{run}"
    start_ms = (int(time.time() * 1000) - 3 * HOUR) // HOUR * HOUR
    events = _burst(user, start_ms)
    EventProducer(applied.kafka.bootstrap, client_config=applied.kafka.client_config).publish(
        [Emitted(source.name, user, encode(_record(e)), e[EVENT_TIME], _record(e)) for e in events]
    )
    job = start_feature_job(
        applied,
        tmp_path / "job.log",
        restore=False,
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: source.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=dead.name,
        LOOPLINE_STREAM__GROUP_ID=f"decay-{run}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(tmp_path / "offline"),
    )
    store = feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    try:

        def absorbed() -> bool:
            return store.get_online_features([f"{VIEW}:txn_count_24h"], [{"user_id": user}]).to_dict()["txn_count_24h"] == [
                len(events)
            ]

        assert wait_until(absorbed, 180, 0.5), f"the job did not absorb the burst; see {tmp_path / 'job.log'}"
        # What-if reads of a live job (one stopped would have them read as of its progress, flagged stale): it has
        # said it absorbed its topic up to the present.
        reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
        absorbed_at = int(time.time() * 1000)
        assert wait_until(lambda: (reader.progress_ms(VIEW) or 0) >= absorbed_at, 30, 0.2), "the job's progress"
        _read_ahead(applied, tmp_path, run, user, start_ms, events, store)
    finally:
        stop_process_group(job)


def _read_ahead(applied: Settings, tmp_path: Path, run: str, user: str, start_ms: int, events: list[dict], store) -> None:
    """Score requests for ``user`` at times from the burst to a day after it, and check each window's value."""
    aggregations = {a.name: a for view in feature_plan(applied).views if view.name == VIEW for a in view.aggregations}
    model = write_linear_model(tmp_path / "decay.onnx", INPUTS, np.full(len(INPUTS), 0.01), -1.0)
    # Requests up to 22 hours ahead of the clock: what-if requests, which the scorer takes once told to.
    ahead = applied.serving.limits.model_copy(update={"max_ahead_s": 26 * HOUR / 1000})
    roomy = applied.model_copy(
        update={"serving": applied.serving.model_copy(update={"feature_budget_ms": 2_000.0, "limits": ahead})}
    )
    # The late event's tile is [+40 s, +50 s): the 5-minute window's tail for requests in [+330 s, +340 s).
    after = {
        "burst": 55 * SECOND,
        "late tile the tail": 335 * SECOND,
        "late tile out": 345 * SECOND,
        "last tile out": 350 * SECOND,
        "5 minutes quiet": 6 * MINUTE,
        "hour quiet": 2 * HOUR,
        "a day less a second": 24 * HOUR - SECOND,
        "a day": 24 * HOUR,
        "day quiet": 25 * HOUR,
    }
    defaults = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path).defaults
    seen: dict[str, dict] = {}
    with serving_doors(roomy, build_scorer(roomy, model)) as (url, _):
        for moment, offset in after.items():
            request = ScoreRequest(
                schema_version=1,
                request_id=f"{run}-{moment}",
                entity_keys={"user_id": user},
                request_fields={},
                requested_at_ms=start_ms + offset,
            )
            reply = requests.post(f"{url}/v1/score", json=request.model_dump(), timeout=10)
            assert reply.ok, reply.text
            record = PredictionRecord.model_validate_json(reply.content)
            assert not record.stale_features, (moment, "a live job's what-if reads are not stale")
            seen[moment] = {name.split(":", 1)[1]: value for name, value in record.features.items()}
            for reference in INPUTS:
                name = reference.split(":", 1)[1]
                want = window_by_definition(aggregations[name], events, start_ms + offset)
                # An empty window's sum, mean or maximum has no value: the model gets the declared default, flagged.
                assert (seen[moment][name], reference in record.defaulted_features) == (
                    (defaults[reference], True) if want is None else (want, False)
                ), (moment, name)

    counts = {moment: features["txn_count_5m"] for moment, features in seen.items()}
    # The late event alone in the tail tile, and the one at +50 s; then that one alone; then none.
    assert counts == {
        "burst": 12,
        "late tile the tail": 2,
        "late tile out": 1,
        "last tile out": 0,
        "5 minutes quiet": 0,
        "hour quiet": 0,
        "a day less a second": 0,
        "a day": 0,
        "day quiet": 0,
    }, counts
    assert (seen["hour quiet"]["txn_count_1h"], seen["hour quiet"]["txn_count_24h"]) == (0, 12)
    # The day's window holds the burst's 15-minute tile until the next day's hour (the worked example in
    # docs/concepts/windows.md).
    assert (seen["a day less a second"]["txn_count_24h"], seen["a day"]["txn_count_24h"]) == (12, 0)
    assert seen["day quiet"] == {
        **dict.fromkeys(("txn_count_5m", "txn_count_1h", "txn_count_24h", "distinct_merchants_1h", "distinct_countries_24h"), 0),
        "amount_sum_1h": 0.0,
        "amount_mean_24h": 0.0,
        "amount_max_24h": 0.0,
    }
    # Feast's own read: the finished values, as of the latest event.
    finished = store.get_online_features([f"{VIEW}:txn_count_5m", f"{VIEW}:txn_count_1h"], [{"user_id": user}]).to_dict()
    assert (finished["txn_count_5m"], finished["txn_count_1h"]) == ([12], [12])
