"""Streaming freshness and the online read path, on a private embedded stack (127.0.0.1 only).

Produces the synthetic transaction stream at a fixed rate into Kafka while the feature job runs
(`loopline stream submit` on PyFlink's mini-cluster) and measures

* sustained events/s: events of the measured window / time from its first event produced until
  its last sampled event is readable online (a warm-up at the same rate precedes the window);
* freshness: event produced -> the entity's new row readable online (sampled events), p50/p99;
* catch-up events/s (full runs): a backlog published first, worked off by a fresh job with the
  machine to itself (from its first row online to the last event's row online);
* the read path for 1 and 64 entities: Loopline's fast reader vs Feast's get_online_features vs a
  raw pipelined redis-py HGETALL of the same keys, measured in the same run; and Loopline's read at
  request time: at the time of the run (``request_time``: the users' windows still hold events) and, per user, at
  the first time its oldest 10-second tile has left the 5-minute window (``tile_merge``: the value read is the merge
  of the tiles the window still holds, the step the job stored for it, not the finished value; the 1-hour and 1-day
  windows still hold the whole run, so their first steps hold). The raw read is HGETALL, so it returns the steps too.
  Goals: 64 entities with tile merging at most 1.5x the raw read (p50), 1 entity p99 at most 1 ms.

Anchors: Tecton's stated freshness (< 1 s), Hopsworks' online ingest p99 (~250 ms), Feast's
published Python feature server p99 (7.2 ms for 1 row). Machine: the 2-core box this runs on.
The last line printed is one JSON object with every figure.

    python benchmarks/stream_freshness.py [--quick] [--rate 5000] [--seconds 30] [--backlog 150000]
"""

from __future__ import annotations

import argparse
import itertools
import signal
import statistics
import struct
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
from loopline.job_processes import start_feature_job, stop_process_group, wait_until_serving  # noqa: E402
from loopline.settings import Settings  # noqa: E402
from schemas.topics import TRANSACTIONS  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.synthetic import SyntheticConfig, SyntheticStream, synthetic_user_id  # noqa: E402
from streams.topics import apply_topics  # noqa: E402

USER_VIEW = "user_transaction_features"
ANCHORS = {"tecton_freshness_s": 1.0, "hopsworks_ingest_p99_ms": 250.0, "feast_server_p99_1_row_ms": 7.2}
#: The issue's goals for reads at request time.
GOALS = {"tile_merge_64_over_raw_p50": 1.5, "tile_merge_1_p99_ms": 1.0}
#: The 5-minute window (10-second slides), read where its oldest tile has left it.
MERGE_SLIDE_MS, MERGE_WINDOW_MS = 10_000, 300_000
console = Console()





def measure_streaming(settings: Settings, rate: float, seconds: float, warmup_s: float, start_timeout_s: float) -> dict:
    """Run the job, produce at ``rate`` for ``warmup_s + seconds``; measure the last ``seconds``.

    The load is generated before timing starts, so the producer's share of the 2 cores is only
    Kafka's client, as it would be for a producer on another machine. The warm-up lets the JVM
    compile the job's hot paths; freshness is sampled (user rows) only after it.
    """
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    producer = EventProducer(settings.kafka.bootstrap)
    config = SyntheticConfig(rate_per_s=rate, late_rate=0.0, out_of_order_rate=0.0, malformed_rate=0.0)
    stream = SyntheticStream(config, seed=11, start_ms=int(time.time() * 1000))
    end_ms = stream.start_ms + (warmup_s + seconds) * 1000
    load = list(itertools.takewhile(lambda e: e.emit_at_ms < end_ms, stream))
    measured_from_ms = stream.start_ms + warmup_s * 1000
    sample_every = max(1, int(rate // 20))
    job = start_feature_job(settings, settings.home / "job.log", LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline"))
    try:
        # Job start-up is not freshness: a first event must come through before timing starts.
        wait_until_serving(job, settings, reader, start_timeout_s)
        samples: list[tuple[str, int, float]] = []  # (user, event time ms, produced at)
        measured = {"events": 0, "began": 0.0}

        def paced():
            for index, emitted in enumerate(load):
                if emitted.emit_at_ms >= measured_from_ms and emitted.topic == TRANSACTIONS.name:
                    if not measured["events"]:
                        measured["began"] = time.monotonic()
                    measured["events"] += 1
                    if index % sample_every == 0:
                        samples.append((emitted.key, emitted.record.event_time_ms, time.time()))
                yield emitted

        freshness: list[float] = []
        done = threading.Event()

        def watch() -> None:
            pending: list[tuple[str, int, float]] = []
            seen = 0
            while not (done.is_set() and not pending and seen == len(samples)):
                pending += samples[seen:]
                seen = len(samples)
                if pending:
                    stamps = reader.row_timestamps_us(USER_VIEW, [user for user, _, _ in pending])
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
        elapsed = time.monotonic() - measured["began"]
        caught_up = not watcher.is_alive()
        return {
            "events": measured["events"],
            "sustained_events_per_s": round(measured["events"] / elapsed, 1) if caught_up else None,
            "freshness_p50_s": round(statistics.median(freshness), 3) if freshness else None,
            "freshness_p99_s": round(percentile(freshness, 0.99), 3) if freshness else None,
            "freshness_samples": len(freshness),
        }
    finally:
        stop_process_group(job, signal.SIGKILL)


def measure_catch_up(settings: Settings, events: int, start_timeout_s: float) -> dict:
    """Publish ``events`` transactions first, then start the job: how fast it works off the backlog.

    The job's capacity with the machine to itself (no producer competing), timed from its first
    row online to the last event's row online, so start-up does not count.
    """
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    config = SyntheticConfig(rate_per_s=5000.0, late_rate=0.0, out_of_order_rate=0.0, malformed_rate=0.0)
    stream = SyntheticStream(config, seed=12, start_ms=int(time.time() * 1000))
    topic = replace(TRANSACTIONS, name="bench.catch-up")  # holds only the backlog
    transactions = (replace(e, topic=topic.name) for e in stream if e.topic == TRANSACTIONS.name)
    backlog = list(itertools.islice(transactions, events))
    with console.status(f"publishing a backlog of {events:,} events"):
        apply_topics(settings.kafka.bootstrap, [topic])
        EventProducer(settings.kafka.bootstrap).publish(backlog)
    last = backlog[-1]
    client = redis.Redis(port=settings.redis.port)
    client.flushdb()  # the stack is the benchmark's own: an empty store shows the job's first row
    job = start_feature_job(settings, settings.home / "catch-up.log", LOOPLINE_STREAM__GROUP_ID="catch-up",
                            LOOPLINE_STREAM__SOURCE_TOPIC=topic.name,
                            LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline-catch-up"))  # fmt: skip
    try:
        with console.status("waiting for the job's first rows"):
            if not wait_until(lambda: client.dbsize() > 0 or job.poll() is not None, start_timeout_s, 0.05):
                raise RuntimeError("the feature job wrote nothing; see catch-up.log")
        began = time.monotonic()
        with console.status("working off the backlog"):
            caught_up = wait_until(
                lambda: (reader.row_timestamps_us(USER_VIEW, [last.key])[0] or 0) >= last.record.event_time_ms * 1000,
                300,
                0.05,
            )
        return {"catch_up_events_per_s": round(events / (time.monotonic() - began), 1) if caught_up else None}
    finally:
        stop_process_group(job, signal.SIGKILL)


def _merge_times(reader: OnlineReader, client: redis.Redis, users: list[str]) -> list[int]:
    """Per user, the first read time (ms) at which its oldest 10-second tile with events has left the 5-minute window:
    where the window's first step ends (``feature_store/window_tiles.py``)."""
    steps_field, window = reader.layout.views[USER_VIEW].windows[(MERGE_SLIDE_MS, MERGE_WINDOW_MS)]
    stored = [client.hget(reader.layout.redis_key("user_id", u), steps_field) for u in users]
    return [struct.unpack_from("<q", steps, 8)[0] * window.slide_ms for steps in stored]


def measure_reads(settings: Settings, iterations: int) -> dict:
    """p50/p99 (ms) of the three read paths for 1 and 64 entities, same keys, same run."""
    store = feature_store(settings.feast_registry_path, settings.redis_connection)
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)
    client = redis.Redis(port=settings.redis.port)
    features = [f"{USER_VIEW}:{f.name}" for f in feature_fields(store.get_stream_feature_view(USER_VIEW))]
    users = [synthetic_user_id(i) for i in range(64)]  # the most active synthetic users: all have rows
    figures: dict = {}
    now_ms = int(time.time() * 1000)
    merge_at = _merge_times(reader, client, users)
    for count in (1, 64):
        rows = [{"user_id": u} for u in users[:count]]
        keys = [reader.layout.redis_key("user_id", u) for u in users[:count]]

        def raw(keys=keys) -> None:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            pipe.execute()

        now, later = [now_ms] * count, merge_at[:count]
        paths = {
            "loopline": lambda rows=rows: reader.get_online_features(features, rows),
            "request_time": lambda rows=rows, at=now: reader.read_with_row_times(features, rows, at),
            "tile_merge": lambda rows=rows, at=later: reader.read_with_row_times(features, rows, at),
            "feast_sdk": lambda rows=rows: store.get_online_features(features, rows),
            "raw_redis": raw,
        }
        for name, call in paths.items():
            for _ in range(max(5, iterations // 10)):
                call()
            timings = []
            for _ in range(iterations):
                began = time.perf_counter()
                call()
                timings.append((time.perf_counter() - began) * 1000)
            figures[f"read_{name}_{count}_p50_ms"] = round(statistics.median(timings), 3)
            figures[f"read_{name}_{count}_p99_ms"] = round(percentile(timings, 0.99), 3)
        figures[f"read_{count}_feast_over_loopline_p50"] = round(
            figures[f"read_feast_sdk_{count}_p50_ms"] / figures[f"read_loopline_{count}_p50_ms"], 2
        )
        for name in ("loopline", "request_time", "tile_merge"):
            figures[f"read_{count}_{name}_over_raw_p50"] = round(
                figures[f"read_{name}_{count}_p50_ms"] / figures[f"read_raw_redis_{count}_p50_ms"], 2
            )
    rows = [{"user_id": u} for u in users]
    merged, finished = reader.read_with_row_times(features, rows, merge_at)[0], reader.get_online_features(features, rows)
    # 64 when every merging read took a later step: the oldest tile's events are gone and the others counted.
    figures["tile_merge_partial_5m_counts"] = sum(0 < m < f for m, f in zip(merged["txn_count_5m"], finished["txn_count_5m"], strict=True))
    figures["goal_tile_merge_64_over_raw_met"] = figures["read_64_tile_merge_over_raw_p50"] <= GOALS["tile_merge_64_over_raw_p50"]
    figures["goal_tile_merge_1_p99_met"] = figures["read_tile_merge_1_p99_ms"] <= GOALS["tile_merge_1_p99_ms"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (within a minute)")
    parser.add_argument("--rate", type=float, default=5000.0, help="transactions per second to produce")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to produce")
    parser.add_argument("--backlog", type=int, default=150_000, help="events of the catch-up run (0: skip it)")
    args = parser.parse_args()
    rate, seconds, warmup, iterations = (1000.0, 5.0, 3.0, 200) if args.quick else (args.rate, args.seconds, 15.0, 2000)

    began = time.monotonic()
    with private_stack(console, "loopline-bench-") as settings:
        figures = measure_streaming(settings, rate, seconds, warmup, start_timeout_s=45 if args.quick else 120)
        if args.backlog and not args.quick:
            figures |= measure_catch_up(settings, args.backlog, start_timeout_s=120)
        with console.status("timing the read paths"):
            figures |= measure_reads(settings, iterations)
    anchors = {
        "freshness_p50_s": f"Tecton < {ANCHORS['tecton_freshness_s']} s",
        "freshness_p99_s": f"Hopsworks p99 ~{ANCHORS['hopsworks_ingest_p99_ms'] / 1000} s",
        "read_loopline_1_p99_ms": f"Feast server p99 {ANCHORS['feast_server_p99_1_row_ms']} ms",
    }
    report(console, "stream freshness and reads", args.quick, figures | {"rate": rate, "seconds": seconds}, anchors, began)


if __name__ == "__main__":
    main()
