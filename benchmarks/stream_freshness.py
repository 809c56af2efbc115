"""Streaming freshness and the online read path, on a private embedded stack (127.0.0.1 only).

Offers the synthetic stream's transactions to Kafka at a constant rate (one every 1/rate s) while the feature job runs
(`loopline stream submit` on PyFlink's mini-cluster), and measures

* offered events/s: what the producer, on the same cores, actually sent over the measured window;
* sustained events/s: events of the measured window / time from its first event's scheduled send until its last
  sampled event is readable online (a warm-up at the same rate, 60 s by default, precedes the window); at a fixed
  offer it cannot pass the offer: it says how far behind the job ended, not what it could absorb (catch-up says that);
* freshness: an event's scheduled send -> the entity's new row readable online (sampled events), p50/p99. Goal: at
  5,000/s, p99 at most 1 s (``goal_stream_5000_met``; counted from the schedule, so it also says the offer held);
* catch-up events/s (full runs): a backlog published first, worked off by a fresh job with the
  machine to itself (from its first row online to the last event's row online);
* the read path for 1 and 64 entities: Loopline's fast reader vs Feast's get_online_features vs a
  raw pipelined redis-py HGETALL of the same keys, measured in the same run; and Loopline's read at
  request time: at the time of the run (``request_time``: the users' windows still hold events) and, per user, at
  the first time its oldest 10-second tile has left the 5-minute window (``tile_merge``: the value read is the merge
  of the tiles the window still holds, the step the job stored for it, not the finished value; the 1-hour and 1-day
  windows still hold the whole run, so their first steps hold). The raw read is HGETALL (the issue's anchor), so it
  returns the steps and the finished values too; ``raw_hmget`` asks for exactly the fields Loopline's reader asks for
  and decodes nothing (``tile_merge_over_raw_hmget``: the merging read over Redis alone, like for like). Goals: 64
  entities with tile merging at most 1.5x the raw HGETALL (p50), 1 entity p99 at most 1 ms. A read of users with
  a day of history (``day_``: 64 users with a transaction every ~5 minutes for the past 24 h, sent before the run)
  measures the same paths where every window holds many tiles (full runs).

Anchors: Tecton's stated freshness (< 1 s), Hopsworks' online ingest p99 (~250 ms), Feast's
published Python feature server p99 (7.2 ms for 1 row). Machine: the 2-core box this runs on.
The last line printed is one JSON object with every figure.

    python benchmarks/stream_freshness.py [--quick] [--rate 5000] [--seconds 30] [--warmup 60] [--backlog 150000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import redis
from rich.console import Console
from rich.progress import Progress

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.config import feature_fields, feature_store  # noqa: E402
from feature_store.online_read import OnlineReader  # noqa: E402
from harness import percentile, private_stack, report  # noqa: E402  (this folder)
from infra.service import wait_until  # noqa: E402
from loopline.components import feature_plan, project  # noqa: E402
from loopline.job_processes import start_feature_job, stop_process_group, wait_until_serving  # noqa: E402
from loopline.project import world_class, world_of  # noqa: E402
from loopline.settings import Settings  # noqa: E402
from schemas.project import Project  # noqa: E402
from streams.feature_plan import ViewPlan  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.topics import apply_topics  # noqa: E402
from streams.world import Emitted  # noqa: E402

USER_VIEW = "user_transaction_features"
ANCHORS = {"tecton_freshness_s": 1.0, "hopsworks_ingest_p99_ms": 250.0, "feast_server_p99_1_row_ms": 7.2}
#: The issue's goals for reads at request time.
GOALS = {
    "tile_merge_64_over_raw_p50": 1.5,
    "tile_merge_1_p99_ms": 1.0,
    "stream_rate_per_s": 5000.0,
    "stream_freshness_p99_s": 1.0,
}
#: The 5-minute window (10-second slides), read where its oldest tile has left it.
MERGE_SLIDE_MS, MERGE_WINDOW_MS = 10_000, 300_000
#: Users with a day of history, read besides the run's own (``_day_of_history``).
DAY_USERS = 64
console = Console()


def _user_view(settings: Settings) -> ViewPlan:
    """The plan of ``USER_VIEW``: the topic it reads (the transactions), its join key (the user) and event time field."""
    return next(view for view in feature_plan(settings).views if view.name == USER_VIEW)


def _synthetic_user_id(declared: Project, rank: int) -> str:
    """The id of the project's synthetic user of activity rank ``rank`` (0 is the busiest): the fraud world's own."""
    return sys.modules[world_class(declared).__module__].synthetic_user_id(rank)


def _no_noise_world(settings: Settings, rate: float, seed: int, start_ms: int):
    """The project's world at ``rate`` from ``start_ms``, its events neither late, out of order nor malformed."""
    return world_of(project(settings), seed, start_ms, rate_per_s=rate, late_rate=0.0, out_of_order_rate=0.0, malformed_rate=0.0)


def measure_streaming(
    settings: Settings, rate: float, seconds: float, warmup_s: float, start_timeout_s: float, day_history: bool
) -> dict:
    """Run the job, offer it transactions at a constant ``rate`` for ``warmup_s + seconds``; measure the last ``seconds``.

    The synthetic stream's transactions are sent one every ``1 / rate`` s (its traffic bursts flattened: its own
    timing offers ``rate`` only on average over bursts, ~3,860/s between them at 5,000/s; the events keep their own
    event times, which so fall behind the send schedule, ~20 s by the end of a full run), and every latency counts
    from a record's scheduled send time, so a producer that falls behind shows as latency, not as a lower offer. The
    load is generated before timing starts, so the producer's share of the 2 cores is only Kafka's client, as it
    would be for a producer on another machine. The warm-up lets the JVM compile the job's hot paths (45 s after the
    job started, its JIT compiler still took a third of a core, compiling ~400 methods every 5 s); freshness is
    sampled (user rows) only after it. With ``day_history`` the day users' history (``_day_of_history``) goes first.
    """
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    producer = EventProducer(settings.kafka.bootstrap)
    view = _user_view(settings)
    (user_key,), time_field = view.entity_keys, view.time_field
    start_ms = int(time.time() * 1000)
    stream = _no_noise_world(settings, rate, 11, start_ms)
    transactions = (e for e in stream if e.topic == view.topic)
    total, measured_from = int(rate * (warmup_s + seconds)), int(rate * warmup_s)
    load = [replace(e, emit_at_ms=start_ms + int(i * 1000 / rate)) for i, e in enumerate(itertools.islice(transactions, total))]
    sample_every = max(1, int(rate // 20))
    if day_history:
        with console.status("publishing the day users' history"):
            producer.publish(
                _day_of_history(project(settings), view, start_ms - 10_000)
            )  # before the job starts: it reads them first
    job = start_feature_job(settings, settings.home / "job.log", LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline"))
    try:
        # Job start-up is not freshness: a first event must come through before timing starts.
        wait_until_serving(job, settings, reader, feature_plan(settings), start_timeout_s)
        samples: list[tuple[str, int, float]] = []  # (user, event time ms, scheduled send time)
        sent = {"first": 0.0, "measured_from": 0.0, "last": 0.0}

        def paced():
            for index, emitted in enumerate(load):
                scheduled = sent["first"] + (emitted.emit_at_ms - start_ms) / 1000
                if index == 0:
                    sent["first"] = scheduled = time.time()
                if index == measured_from:
                    sent["measured_from"] = scheduled
                if index >= measured_from and index % sample_every == 0:
                    samples.append((emitted.key, getattr(emitted.record, time_field), scheduled))
                yield emitted
                sent["last"] = time.time()  # the generator resumes once the record before has been handed to Kafka

        freshness: list[float] = []
        done = threading.Event()

        def watch() -> None:
            pending: list[tuple[str, int, float]] = []
            seen = 0
            while not (done.is_set() and not pending and seen == len(samples)):
                pending += samples[seen:]
                seen = len(samples)
                if pending:
                    stamps = reader.row_timestamps_us(USER_VIEW, [{user_key: user} for user, _, _ in pending])
                    now = time.time()
                    still = []
                    for (user, event_ms, produced_at), stamp in zip(pending, stamps, strict=True):
                        if stamp is not None and stamp >= event_ms * 1000:
                            freshness.append(now - produced_at)
                        else:
                            still.append((user, event_ms, produced_at))
                    pending = still
                time.sleep(0.02)  # the watcher shares the 2 cores with the job it measures

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{rate:.0f} events/s ({warmup_s:.0f} s warm-up)", total=len(load))
            producer.publish(paced(), rate_per_s=rate, on_progress=lambda n: progress.update(task, completed=n))
        done.set()
        watcher.join(timeout=120)
        caught_up = not watcher.is_alive()
        events = total - measured_from
        return {
            "events": events,
            "offered_events_per_s": round(events / (sent["last"] - sent["measured_from"]), 1),
            "sustained_events_per_s": round(events / (time.time() - sent["measured_from"]), 1) if caught_up else None,
            "freshness_p50_s": round(statistics.median(freshness), 3) if freshness else None,
            "freshness_p99_s": round(percentile(freshness, 0.99), 3) if freshness else None,
            "freshness_samples": len(freshness),
            # Every sampled event's latency counts from its scheduled send, so this also says the offer was kept up.
            "goal_stream_5000_met": caught_up
            and bool(freshness)
            and rate >= GOALS["stream_rate_per_s"]
            and percentile(freshness, 0.99) <= GOALS["stream_freshness_p99_s"],
        }
    finally:
        stop_process_group(job, signal.SIGKILL)


def measure_catch_up(settings: Settings, events: int, start_timeout_s: float) -> dict:
    """Publish ``events`` transactions first, then start the job: how fast it works off the backlog.

    The job's capacity with the machine to itself (no producer competing), timed from its first
    row online to the last event's row online, so start-up does not count.
    """
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    view = _user_view(settings)
    (user_key,), time_field = view.entity_keys, view.time_field
    stream = _no_noise_world(settings, 5000.0, 12, int(time.time() * 1000))
    declared = next(spec for spec in project(settings).topics if spec.name == view.topic)
    topic = replace(declared, name="bench.catch-up")  # holds only the backlog
    transactions = (replace(e, topic=topic.name) for e in stream if e.topic == view.topic)
    backlog = list(itertools.islice(transactions, events))
    with console.status(f"publishing a backlog of {events:,} events"):
        apply_topics(settings.kafka.bootstrap, [topic])
        EventProducer(settings.kafka.bootstrap).publish(backlog)
    first, last = backlog[0], backlog[-1]

    def has_row_of(emitted: Emitted) -> bool:
        return (reader.row_timestamps_us(USER_VIEW, [{user_key: emitted.key}])[0] or 0) >= getattr(
            emitted.record, time_field
        ) * 1000

    job = start_feature_job(
        settings,
        settings.home / "catch-up.log",
        LOOPLINE_STREAM__GROUP_ID="catch-up",
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({view.topic: topic.name}),
        LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline-catch-up"),
    )
    try:
        with console.status("waiting for the job's first rows"):
            # The backlog is newer than anything the store holds, so its first user's row shows the job's first rows.
            if not wait_until(lambda: has_row_of(first) or job.poll() is not None, start_timeout_s, 0.05):
                raise RuntimeError("the feature job wrote nothing; see catch-up.log")
        began = time.monotonic()
        with console.status("working off the backlog"):
            caught_up = wait_until(lambda: has_row_of(last), 300, 0.05)
        return {"catch_up_events_per_s": round(events / (time.monotonic() - began), 1) if caught_up else None}
    finally:
        stop_process_group(job, signal.SIGKILL)


def _day_of_history(declared: Project, view: ViewPlan, end_ms: int) -> list[Emitted]:
    """The day users' transactions (on ``view``'s topic): each of ``DAY_USERS`` users every 3 to 7 minutes over the 24 h
    before ``end_ms`` (~290 each), in event-time order, so every window of theirs holds many tiles."""
    transaction = declared.contract(view.topic).record_type
    rng = random.Random(5)
    events = []
    for n in range(DAY_USERS):
        user, at = f"day-user-{n}", end_ms - 86_400_000
        while (at := at + rng.randint(180_000, 420_000)) < end_ms:
            record = transaction(
                schema_version=1,
                event_id=f"{user}-{at}",
                event_time_ms=at,
                user_id=user,
                merchant_id=f"m{rng.randrange(60)}",
                amount=round(rng.uniform(1, 400), 2),
                currency="EUR",
                merchant_category="grocery",
                channel="pos",
                country=rng.choice(["DE", "FR", "NL", "ES"]),
            )
            events.append(Emitted(view.topic, user, declared.encode(view.topic, record), at, record))
    return sorted(events, key=lambda e: e.emit_at_ms)


def _merge_times(reader: OnlineReader, client: redis.Redis, users: list[str]) -> list[int]:
    """Per user, the first read time (ms) at which its oldest 10-second tile with events has left the 5-minute window:
    where the window's first step ends (``feature_store/window_tiles.py``)."""
    steps_field, window = reader.layout.views[USER_VIEW].windows[(MERGE_SLIDE_MS, MERGE_WINDOW_MS)]
    join_keys = reader.layout.views[USER_VIEW].join_keys
    stored = [client.hget(reader.layout.redis_key(join_keys, (u,)), steps_field) for u in users]
    return [window.first_bound(steps) * window.slide_ms for steps in stored]


def _timed(name: str, call, iterations: int) -> dict:
    """``read_<name>_p50_ms`` and ``_p99_ms`` of ``call`` over ``iterations`` (after a tenth as many warming up)."""
    for _ in range(max(5, iterations // 10)):
        call()
    timings = []
    for _ in range(iterations):
        began = time.perf_counter()
        call()
        timings.append((time.perf_counter() - began) * 1000)
    return {
        f"read_{name}_p50_ms": round(statistics.median(timings), 3),
        f"read_{name}_p99_ms": round(percentile(timings, 0.99), 3),
    }


def _raw_read(client: redis.Redis, keys: list[bytes], fields: list[bytes] | None = None) -> None:
    """The raw read: every field of each key's hash, one pipelined HGETALL each; or only ``fields``, one HMGET each."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        if fields is None:
            pipe.hgetall(key)
        else:
            pipe.hmget(key, fields)
    pipe.execute()


def _day_reads(reader: OnlineReader, client: redis.Redis, features: list[str], now_ms: int, iterations: int) -> dict:
    """The day users read at request time 10 minutes after the run (each window has lost tiles, so every read takes a
    later step) and by raw HGETALL; and how many of them have a row."""
    join_keys = reader.layout.views[USER_VIEW].join_keys
    day_users = [f"day-user-{n}" for n in range(DAY_USERS)]
    day_rows = [dict(zip(join_keys, (u,), strict=True)) for u in day_users]
    day_keys = [reader.layout.redis_key(join_keys, (u,)) for u in day_users]
    later = [now_ms + 600_000] * DAY_USERS
    figures = _timed("day_request_time_64", lambda: reader.read_with_row_times(features, day_rows, later), iterations)
    figures |= _timed("day_raw_redis_64", lambda: _raw_read(client, day_keys), iterations)
    figures["read_day_64_request_time_over_raw_p50"] = round(
        figures["read_day_request_time_64_p50_ms"] / figures["read_day_raw_redis_64_p50_ms"], 2
    )
    figures["day_users_read"] = sum(
        t is not None for t in reader.read_with_row_times(features, day_rows, [now_ms] * DAY_USERS)[1][USER_VIEW]
    )
    return figures


def measure_reads(settings: Settings, iterations: int, day_history: bool) -> dict:
    """p50/p99 (ms) of the read paths for 1 and 64 entities, same keys, same run; with ``day_history``, of the day
    users too."""
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    client = redis.Redis(port=settings.redis.port)
    names = [f.name for f in feature_fields(store.get_stream_feature_view(USER_VIEW))]
    features = [f"{USER_VIEW}:{name}" for name in names]
    fields = reader.hash_fields(USER_VIEW, names)  # the raw HMGET: the very fields the reader asks for, not decoded
    users = [_synthetic_user_id(project(settings), i) for i in range(64)]  # the most active synthetic users: all have rows
    join_keys = reader.layout.views[USER_VIEW].join_keys  # the user's (one)
    figures: dict = {}
    now_ms = int(time.time() * 1000)
    merge_at = _merge_times(reader, client, users)

    for count in (1, 64):
        rows = [dict(zip(join_keys, (u,), strict=True)) for u in users[:count]]
        keys = [reader.layout.redis_key(join_keys, (u,)) for u in users[:count]]
        now, later = [now_ms] * count, merge_at[:count]
        paths = {
            "loopline": lambda rows=rows: reader.get_online_features(features, rows),
            "request_time": lambda rows=rows, at=now: reader.read_with_row_times(features, rows, at),
            "tile_merge": lambda rows=rows, at=later: reader.read_with_row_times(features, rows, at),
            "feast_sdk": lambda rows=rows: store.get_online_features(features, rows),
            "raw_redis": lambda keys=keys: _raw_read(client, keys),
            "raw_hmget": lambda keys=keys: _raw_read(client, keys, fields),
        }
        for name, call in paths.items():
            figures |= _timed(f"{name}_{count}", call, iterations)
        figures[f"read_{count}_feast_over_loopline_p50"] = round(
            figures[f"read_feast_sdk_{count}_p50_ms"] / figures[f"read_loopline_{count}_p50_ms"], 2
        )
        for name in ("loopline", "request_time", "tile_merge"):
            figures[f"read_{count}_{name}_over_raw_p50"] = round(
                figures[f"read_{name}_{count}_p50_ms"] / figures[f"read_raw_redis_{count}_p50_ms"], 2
            )
        figures[f"read_{count}_tile_merge_over_raw_hmget_p50"] = round(
            figures[f"read_tile_merge_{count}_p50_ms"] / figures[f"read_raw_hmget_{count}_p50_ms"], 2
        )
    if day_history:
        figures |= _day_reads(reader, client, features, now_ms, iterations)
    rows = [dict(zip(join_keys, (u,), strict=True)) for u in users]
    merged, finished = reader.read_with_row_times(features, rows, merge_at)[0], reader.get_online_features(features, rows)
    # 64 when every merging read took a later step: the oldest tile's events are gone and the others counted.
    figures["tile_merge_partial_5m_counts"] = sum(
        0 < m < f for m, f in zip(merged["txn_count_5m"], finished["txn_count_5m"], strict=True)
    )
    # A goal of the merging read counts only where every such read took a later step.
    merging = figures["tile_merge_partial_5m_counts"] == len(users)
    figures["goal_tile_merge_64_over_raw_met"] = (
        merging and figures["read_64_tile_merge_over_raw_p50"] <= GOALS["tile_merge_64_over_raw_p50"]
    )
    figures["goal_tile_merge_1_p99_met"] = merging and figures["read_tile_merge_1_p99_ms"] <= GOALS["tile_merge_1_p99_ms"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (within a minute)")
    parser.add_argument("--rate", type=float, default=5000.0, help="transactions per second to produce")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to produce")
    parser.add_argument("--backlog", type=int, default=150_000, help="events of the catch-up run (0: skip it)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds offered before the measured window")
    args = parser.parse_args()
    rate, seconds, warmup, iterations = (1000.0, 5.0, 3.0, 200) if args.quick else (args.rate, args.seconds, args.warmup, 2000)

    began = time.monotonic()
    with private_stack(console, "loopline-bench-") as settings:
        figures = measure_streaming(settings, rate, seconds, warmup, 45 if args.quick else 120, day_history=not args.quick)
        if args.backlog and not args.quick:
            figures |= measure_catch_up(settings, args.backlog, start_timeout_s=120)
        with console.status("timing the read paths"):
            figures |= measure_reads(settings, iterations, day_history=not args.quick)
    anchors = {
        "freshness_p50_s": f"Tecton < {ANCHORS['tecton_freshness_s']} s",
        "freshness_p99_s": f"Hopsworks p99 ~{ANCHORS['hopsworks_ingest_p99_ms'] / 1000} s",
        "read_loopline_1_p99_ms": f"Feast server p99 {ANCHORS['feast_server_p99_1_row_ms']} ms",
    }
    report(console, "stream freshness and reads", args.quick, figures | {"rate": rate, "seconds": seconds}, anchors, began)


if __name__ == "__main__":
    main()
