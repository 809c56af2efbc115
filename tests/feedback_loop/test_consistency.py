"""Row-level online/offline consistency: logged features against the point-in-time recompute, each comparison told
apart as a match, a lag (the online row was older than the request), ahead (newer: the requester's clock behind the
events'), a value mismatch, missing or extra.

The logged requests here are made from the recompute itself (with a plan whose window is one bucket off for the
broken case), so every outcome is known in advance; tests/feedback_loop/test_monitor.py runs it against the real job and scorer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from feedback_loop.consistency import by_outcome, check_consistency, events_needed_since, sampled, summary
from schemas.records import PredictionRecord
from streams.feature_plan import AggregationSpec, ViewPlan
from streams.recompute import LATEST_EVENT, recompute
from tests.support.templates import fraud_plan, view_plan

MINUTE = 60_000
VIEW = view_plan(
    "user_features",
    (
        AggregationSpec("txn_count_5m", "count", "amount", 5 * MINUTE, MINUTE),
        AggregationSpec("amount_sum_1h", "sum", "amount", 60 * MINUTE, MINUTE),
    ),
    topic="t",
    out_of_orderness_ms=5_000,
)
PLAN = fraud_plan(VIEW, topic="t", out_of_orderness_ms=5_000)
START = 1_790_000_000_000


def _events(users: int = 40, per_user: int = 30, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [
        {"user_id": f"u{u}", "event_time_ms": START + int(t), "amount": round(float(rng.uniform(1, 300)), 2)}
        for u in range(users)
        for t in np.sort(rng.uniform(0, 90 * MINUTE, per_user))
    ]
    return pd.DataFrame(rows)


def _logged(events: pd.DataFrame, plan_view: ViewPlan, lag_events: int = 0, stamped_after_ms: int = 1) -> list[PredictionRecord]:
    """A request per event, stamped ``stamped_after_ms`` after it, logging what ``plan_view`` reads at the request's time
    (windows as of it, or of the row's event if later) from the row ``lag_events`` events earlier (with that row's
    time), as a scorer reading a lagging online store would."""
    records = []
    for user, group in events.sort_values("event_time_ms").groupby("user_id"):
        times = group["event_time_ms"].tolist()
        for i, at in enumerate(times):
            row_index = i - lag_events
            features: dict = {f"{VIEW.name}:{name}": None for name in VIEW.feature_names}
            row_times = {}
            if row_index >= 0:
                read_at = max(at + stamped_after_ms, times[row_index])
                (as_of,) = recompute(
                    plan_view, group.iloc[: row_index + 1], pd.DataFrame({"user_id": [user], "at_ms": [read_at]})
                ).to_dict("records")
                features = {f"{VIEW.name}:{name}": as_of[name] for name in VIEW.feature_names}
                row_times = {VIEW.name: int(as_of[LATEST_EVENT])}
            records.append(
                PredictionRecord(
                    schema_version=1,
                    request_id=f"r-{user}-{i}",
                    entity_keys={"user_id": user},
                    features=features,
                    defaulted_features=[name for name, v in features.items() if v is None],
                    model_name="m",
                    model_version="1",
                    score=0.5,
                    requested_at_ms=at + stamped_after_ms,
                    scored_at_ms=at + 2,
                    feature_row_times_ms=row_times,
                )
            )
    return records


def test_a_healthy_online_path_matches_and_a_lagging_one_is_told_from_a_wrong_one() -> None:
    events = _events()
    healthy = check_consistency(PLAN, {"t": events}, _logged(events, VIEW))
    assert by_outcome(healthy) == {"match": 2 * len(events), "lag": 0, "ahead": 0, "value": 0, "missing": 0, "extra": 0}
    assert all(c.smape == 0 for c in healthy.values())

    # One event behind: every request after a user's first sees the previous event's row (older than the request).
    lagging = check_consistency(PLAN, {"t": events}, _logged(events, VIEW, lag_events=1))
    outcomes = by_outcome(lagging)
    users = events["user_id"].nunique()
    assert outcomes["missing"] == 2 * users, "a user's first request read no row at all"
    assert outcomes["value"] == 0 and outcomes["lag"] > 0
    assert outcomes["lag"] + outcomes["match"] == 2 * (len(events) - users)  # a lagging count can still equal the recompute

    # The requester's clock 1 ms behind the events': each request is stamped before its own event, which the online
    # row already holds. Newer than the request, yet the log's own row: ahead, neither lag nor a wrong value (nor
    # extra for a user's first request, which the recompute as of the request has no row for).
    early = by_outcome(check_consistency(PLAN, {"t": events}, _logged(events, VIEW, stamped_after_ms=-1)))
    assert early["lag"] == early["value"] == early["missing"] == early["extra"] == 0
    assert early["ahead"] + early["match"] == 2 * len(events) and early["ahead"] > len(events)  # a count can stay equal


def test_a_window_one_bucket_off_online_shows_as_that_features_mismatch() -> None:
    events = _events()
    count = VIEW.aggregations[0]
    broken = replace(VIEW, aggregations=(replace(count, window_ms=count.window_ms + count.slide_ms), VIEW.aggregations[1]))
    report = summary(check_consistency(PLAN, {"t": events}, _logged(events, broken)))
    # A user's events come ~3 minutes apart: one more minute of window changes the count of about a quarter of them.
    assert report[f"{VIEW.name}:txn_count_5m"]["mismatch_ratio"] > 0.2
    assert report[f"{VIEW.name}:txn_count_5m"]["smape"] > 0
    assert report[f"{VIEW.name}:amount_sum_1h"]["mismatch_ratio"] == 0.0
    # Lagging as well, the broken feature's values still do not equal the recompute as of their own (older) row:
    # value mismatches, while the healthy feature's differences are all lag.
    both = summary(check_consistency(PLAN, {"t": events}, _logged(events, broken, lag_events=1)))
    # (fewer than above: a user's first request reads no row at all, and read at the request's time a row one event
    # back lacks the request's own event, which the longer window's extra event often makes up for: equal, a match)
    assert both[f"{VIEW.name}:txn_count_5m"]["mismatch_ratio"] > 0.02
    assert both[f"{VIEW.name}:amount_sum_1h"]["mismatch_ratio"] == 0.0 and both[f"{VIEW.name}:amount_sum_1h"]["lag_ratio"] > 0.5


def test_extra_values_and_the_sample_follow_the_entity_key() -> None:
    events = _events(users=10)
    logged = _logged(events, VIEW)
    ghost = logged[0].model_copy(update={"entity_keys": {"user_id": "nobody"}, "request_id": "ghost"})
    report = check_consistency(PLAN, {"t": events}, [*logged, ghost])
    assert by_outcome(report)["extra"] == 2  # values for a user with no event before the request

    kept = {r.entity_keys["user_id"] for r in logged if sampled(r.entity_keys["user_id"], 0.5)}
    assert 0 < len(kept) < 10
    half = check_consistency(PLAN, {"t": events}, logged, sample_rate=0.5)
    assert by_outcome(half)["match"] == 2 * sum(r.entity_keys["user_id"] in kept for r in logged)
    # The sample is the same in every process (Python's own hash of a str is salted per process).
    script = "from feedback_loop.consistency import sampled; print([sampled(f'key-{i}', 0.3) for i in range(200)])"
    runs = {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
        ).stdout
        for seed in ("1", "2")
    }
    assert runs == {f"{[sampled(f'key-{i}', 0.3) for i in range(200)]}\n"}
    share = np.mean([sampled(f"key-{i}", 0.1) for i in range(20_000)])
    assert share == pytest.approx(0.1, abs=0.01)


def test_a_row_newer_than_the_request_is_ahead_only_if_its_events_were_in_kafka_when_it_was_scored() -> None:
    """With log positions (as the monitor reads the log): a row holding an event stamped after the request's time is
    ahead when that event had reached Kafka before the request was scored, and a value mismatch when it had not (no
    log prefix the scorer could have seen explains it)."""
    times = [START + n * MINUTE for n in range(5)] + [START + 4 * MINUTE + 30_000]  # the last in the same bucket
    events = pd.DataFrame(
        {
            "user_id": "u1",
            "event_time_ms": times,
            "amount": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
            "partition": 0,
            "offset": range(6),
            "kafka_ms": [t + 100 for t in times],
        }
    )
    newest = recompute(VIEW, events).iloc[0]  # the row as of the last event
    asked_at = times[-1] - 1  # the request's clock: just before the last event's time

    def outcome(scored_at_ms: int, log: pd.DataFrame = events) -> dict[str, int]:
        record = PredictionRecord(
            schema_version=1,
            request_id=f"r-{scored_at_ms}",
            entity_keys={"user_id": "u1"},
            features={f"{VIEW.name}:{name}": newest[name].item() for name in VIEW.feature_names},
            defaulted_features=[],
            model_name="m",
            model_version="1",
            score=0.5,
            requested_at_ms=asked_at,
            scored_at_ms=scored_at_ms,
            feature_row_times_ms={VIEW.name: int(newest[LATEST_EVENT])},
        )
        return by_outcome(check_consistency(PLAN, {"t": log}, [record]))

    in_kafka = outcome(times[-1] + 200)
    assert in_kafka["ahead"] == 2 and in_kafka["value"] == 0, in_kafka
    not_yet = outcome(times[-1] + 50)  # scored before the last event reached Kafka (at +100 ms)
    assert not_yet["value"] == 2 and not_yet["ahead"] == 0, not_yet
    # Without log positions nothing says when an event reached Kafka: the row's own recompute explains it.
    assert outcome(times[-1] + 50, events.drop(columns=["offset", "kafka_ms"]))["ahead"] == 2


def test_a_row_of_events_from_several_partitions_is_judged_by_the_positions_it_absorbed() -> None:
    """An entity whose events spread over partitions (one that is not the topic's key) has no single log order: a row
    is judged by exactly the events behind it, each partition's up to the offset the row names. A row that had
    absorbed partition 0's events and only the first of partition 1's lags; the same value said to hold every event
    is a value mismatch; without the positions, the one-partition prefixes cannot explain it."""
    times = [START + n * 10_000 for n in range(6)]
    events = pd.DataFrame(
        {
            "user_id": "u1",
            "event_time_ms": times,
            "amount": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
            "partition": [0, 1, 0, 1, 0, 1],
            "offset": [0, 0, 1, 1, 2, 2],
            "kafka_ms": [t + 100 for t in times],
        }
    )
    absorbed = events[(events["partition"] == 0) | (events["offset"] == 0)]  # partition 0's three, partition 1's first
    row = recompute(VIEW, absorbed).iloc[0]
    asked_at = times[-1] + 1_000

    def outcome(positions: str | None) -> dict[str, int]:
        record = PredictionRecord(
            schema_version=1,
            request_id="r",
            entity_keys={"user_id": "u1"},
            features={f"{VIEW.name}:{name}": row[name].item() for name in VIEW.feature_names},
            defaulted_features=[],
            model_name="m",
            model_version="1",
            score=0.5,
            requested_at_ms=asked_at,
            scored_at_ms=asked_at + 5,
            feature_row_times_ms={VIEW.name: int(row[LATEST_EVENT])},
            feature_row_absorbed={} if positions is None else {VIEW.name: positions},
        )
        return by_outcome(check_consistency(PLAN, {"t": events}, [record]))

    assert outcome("0:2,1:0")["lag"] == 2
    assert outcome("0:2,1:2")["value"] == 2, "the whole log's row is not this one"
    assert outcome(None)["value"] == 2, "no prefix of one log order is the row"


def test_the_events_after_the_time_a_batch_names_give_its_whole_report() -> None:
    """Checked over only the events at or after ``events_needed_since`` (what the monitor's reader keeps of the log), a
    batch of the log's later requests gets the report the whole log gives: rows as of the requests, and lagging rows
    (an event older, their windows reaching further back than the earliest request's). Rows ahead of their requests get
    the same outcomes; the SMAPE of those pairs is against the recompute as of the entity's event before the request,
    whose windows may begin before the time named (nothing in the request bounds that event)."""
    events = _events().sort_values("event_time_ms", kind="stable").reset_index(drop=True)
    events = events.assign(partition=0, offset=range(len(events)), kafka_ms=events["event_time_ms"])
    names = [f"{VIEW.name}:{name}" for name in VIEW.feature_names]
    for logged, outcome in (
        (_logged(events, VIEW), "match"),
        (_logged(events, VIEW, lag_events=1), "lag"),
        (_logged(events, VIEW, stamped_after_ms=-1), "ahead"),
    ):
        batch = [r for r in logged if r.requested_at_ms > START + 80 * MINUTE]
        since = events_needed_since(PLAN, batch, names)
        kept = events[events["event_time_ms"] >= since]
        whole, from_since = (check_consistency(PLAN, {"t": log}, batch, features=names) for log in (events, kept))
        assert 0 < len(kept) < len(events) and by_outcome(whole)[outcome] > 0, outcome
        if outcome == "ahead":
            assert {name: c.counts for name, c in from_since.items()} == {name: c.counts for name, c in whole.items()}
        else:
            assert from_since == whole, outcome

    # Only the windows the batch carries count: the 5-minute count alone reaches back 5 minutes and its slide.
    short = [r.model_copy(update={"features": {names[0]: 1, "request:amount": 2.0}, "feature_row_times_ms": {}}) for r in batch]
    earliest = min(r.requested_at_ms for r in batch)
    assert events_needed_since(PLAN, short, names) == earliest - 6 * MINUTE - VIEW.out_of_orderness_ms
    assert events_needed_since(PLAN, short, names[1:]) is None
