"""Bounded state: an entity whose windows are empty for good leaves the feature job's state, and its online row expires
by its view's ttl.

One private stack, the fraud template (the user view's longest window is a day and its ``time_since_previous`` looks
back its ttl, two days; the merchant view's longest window is an hour). Thousands of users with one transaction each,
three days ago, fill the job's state; transactions of other users two days and a minute later move every partition
past them. Restored before that, the job keeps them (it has seen no partition move); after it, its checkpoints
shrink to a fraction (the users left the state), a user seen again then reads
as a new one (no previous transaction within the ttl), exactly as the window definition over all its events says, and
every user's row expires by the ttl.

Real Kafka, Redis, Flink (`loopline stream submit`) and Feast.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import redis

from feature_store.online_read import OnlineReader
from feedback_loop.consistency import features_at
from infra.service import wait_until
from loopline.components import feature_plan
from loopline.job_processes import start_feature_job, stop_process_group
from streams.flink_job import checkpoint_bytes, latest_checkpoint
from streams.producer import EventProducer
from streams.recompute import accepted_events, same_feature_value
from streams.topics import read_topic
from streams.world import Emitted
from tests.support.stack import private_stack, stack_settings
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent

#: The integration tier: a stack of its own.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]
USERS = 4_000
DAY_MS = 86_400_000
#: Checkpoints every second, and an entity checked for leaving at least every 2 s.
JOB_ENV = {"LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS": "1000", "LOOPLINE_STREAM__STATE_CHECK_MS": "2000"}


def _transaction(n: int, user: str, at_ms: int) -> Emitted:
    event = TransactionEvent(
        schema_version=1,
        event_id=f"bounded-{n}",
        event_time_ms=at_ms,
        user_id=user,
        merchant_id=f"m{n % 10}",
        amount=float(n % 97),
        currency="EUR",
        merchant_category="grocery",
        channel="pos",
        country="DE",
    )
    return Emitted(TRANSACTIONS.name, user, FRAUD.encode(TRANSACTIONS.name, event), at_ms, event)


def test_entities_whose_windows_are_empty_for_good_leave_the_state(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path / "stack")
    with private_stack(settings):
        plan = feature_plan(settings)
        users = next(view for view in plan.views if view.name == "user_transaction_features")
        assert users.ttl_ms == 2 * DAY_MS
        start = int(time.time() * 1000) - 3 * DAY_MS
        once = [_transaction(n, f"once-{n}", start + n) for n in range(USERS)]
        EventProducer(settings.kafka.bootstrap).publish(once)
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path, states_refresh_s=0.1)
        log = tmp_path / "job.log"
        job = start_feature_job(settings, log, **JOB_ENV)
        try:
            assert wait_until(
                lambda: job.poll() is not None or (reader.progress_ms(users.name) or 0) >= start + USERS - 1, 240, 0.5
            )
            assert job.poll() is None, log.read_text()[-3000:]
            # The rows held for the offline log (5 s) leave the checkpoints too: measure once they have.
            full_since = time.time() + 6
            assert wait_until(lambda: latest_checkpoint(settings.checkpoint_dir, full_since), 60, 0.2)
            full = checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir))
        finally:
            stop_process_group(job)

        # Restored, the job has seen no partition move yet: its users' leave checks must keep them, not let them go.
        job = start_feature_job(settings, log, **JOB_ENV)
        try:
            restarted = time.time()
            assert wait_until(
                lambda: job.poll() is not None or latest_checkpoint(settings.checkpoint_dir, restarted + 8), 120, 0.2
            )
            assert job.poll() is None and checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir)) > full * 0.9, (
                "a restored job let entities go before their partitions moved"
            )

            later = start + 2 * DAY_MS + 60_000
            returning = [f"once-{n}" for n in range(0, USERS, 400)]
            moving = [_transaction(USERS + n, f"later-{n}", later + n) for n in range(200)]
            again = [_transaction(2 * USERS + i, user, later + 500 + i) for i, user in enumerate(returning)]
            EventProducer(settings.kafka.bootstrap).publish([*moving, *again])
            assert wait_until(lambda: job.poll() is not None or (reader.progress_ms(users.name) or 0) >= later + 500, 120, 0.5)

            def shrunk() -> bool:
                newest = latest_checkpoint(settings.checkpoint_dir)
                return job.poll() is not None or checkpoint_bytes(newest) < full / 4

            assert wait_until(shrunk, 120, 0.5) and job.poll() is None, log.read_text()[-3000:]
            emptied = checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir))
            print(f"checkpoint of {USERS:,} one-event users: {full:,} bytes; once they left: {emptied:,} bytes")
        finally:
            stop_process_group(job)

        # A returning user reads as the window definition over all its events says: nothing within the ttl before.
        events, _ = accepted_events(plan, TRANSACTIONS.name, read_topic(settings.kafka.bootstrap, TRANSACTIONS.name))
        at_ms = later + 1_000
        expected = features_at(users, events, pd.DataFrame({users.entity_key: returning, "at_ms": [at_ms] * len(returning)}))
        got = reader.read_with_row_times(
            [f"{users.name}:{name}" for name in users.feature_names],
            [{users.entity_key: user} for user in returning],
            [at_ms] * len(returning),
        ).values
        for i, user in enumerate(returning):
            assert expected[(user, at_ms)]["secs_since_prev_txn"] is None
            for name in users.feature_names:
                assert same_feature_value(name, expected[(user, at_ms)][name], got[name][i]), (user, name)
        assert got["txn_count_24h"] == [1] * len(returning)

        # Every user's row lives a ttl after its last write (the template's views both keep two days).
        client = redis.Redis(port=settings.redis.port)
        keys = list(client.scan_iter(count=1_000))
        assert keys and all(2 * 86_400 - 600 <= client.ttl(key) <= 2 * 86_400 for key in keys if b"views" not in key)
