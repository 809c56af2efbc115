"""`loopline stream submit --no-restore --from-time T` builds the job's state from the events published since T alone
(what the demo does with its world): an earlier event of the same entity counts in no window."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from feature_store.online_read import OnlineReader
from infra.service import wait_until
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import encode
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.templates import TRANSACTIONS, TransactionEvent

VIEW = "user_transaction_features"
SOURCE = TopicSpec(f"test.start.{uuid.uuid4().hex[:8]}", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)


def _events(user: str, amounts: list[float], at_ms: int) -> list[Emitted]:
    events = [
        TransactionEvent(
            schema_version=1,
            event_id=str(uuid.uuid4()),
            event_time_ms=at_ms + i,
            user_id=user,
            merchant_id=f"m{i}",
            amount=amount,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        for i, amount in enumerate(amounts)
    ]
    return [Emitted(SOURCE.name, user, encode(e), e.event_time_ms, e) for e in events]


def test_the_job_starts_at_the_events_published_since_the_time_given(applied: Settings, tmp_path: Path) -> None:
    bootstrap = applied.kafka.bootstrap
    apply_topics(bootstrap, [SOURCE])
    user, now = f"start-{uuid.uuid4().hex[:8]}", int(time.time() * 1000)
    producer = EventProducer(bootstrap)
    producer.publish(_events(user, [500.0, 400.0], now - 2_000))  # before the job's start time: left out
    time.sleep(0.05)  # Kafka's create time has millisecond resolution: the two publications must not share one
    since_ms = int(time.time() * 1000)
    producer.publish(_events(user, [30.0, 12.5, 7.5], now))
    job = start_feature_job(
        applied,
        tmp_path / "job.log",
        restore=False,
        from_ms=since_ms,
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: SOURCE.name}),
        LOOPLINE_STREAM__GROUP_ID=f"start-{uuid.uuid4().hex[:8]}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(tmp_path / "offline"),
    )
    try:
        reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)

        def features() -> dict:
            read = reader.get_online_features([f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h"], [{"user_id": user}])
            return {name: values[0] for name, values in read.items() if name != "user_id"}

        assert wait_until(lambda: (features()["txn_count_5m"] or 0) >= 3 or job.poll() is not None, 180, 0.5), (
            f"see {tmp_path / 'job.log'}"
        )
        assert features() == {"txn_count_5m": 3, "amount_sum_1h": 50.0}, "only the events published since the start time"
    finally:
        stop_process_group(job)
