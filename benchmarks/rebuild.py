"""A view's rebuild under a changed plan, on a private embedded stack (127.0.0.1 only): how fast the feature job
recomputes retained events into a pending generation, and how long readers wait for the switch.

A backlog of the synthetic stream's transactions is published first. The views' serving generations are recorded as
of a previous plan (as after a change of every view), so the job, started once, rebuilds both views from the oldest
retained event into new generations and promotes them when it has caught up (``feature_store/view_state.py``). It
measures

* ``rebuild_events_per_s``: the backlog events absorbed from the job's first published progress of the new
  generations (it is running, and their rows hold events) to the switch (both promoted), over that time: the events
  of event time up to that first progress were in the rows before it and are not counted (a progress is of rows in
  Redis, not of records read: ``ProgressSink``);
* ``switch_after_start_s``: from starting `loopline stream submit` to the switch (the JVM's and PyFlink's start
  included): what readers of the previous plan wait, stale-flagged once it passes ``serving.stale_after_s``.

No anchor: Flink's own recovery figures are for its state, not a recompute from the log. Machine: the 2-core box
this runs on. The last line printed is one JSON object with every figure.

    python benchmarks/rebuild.py [--quick] [--events 200000]
"""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.online_write import OnlineWriter  # noqa: E402
from feature_store.view_state import SERVING, Generation, read_view_states, views_key  # noqa: E402
from harness import private_stack, report  # noqa: E402  (this folder)
from infra.service import wait_until  # noqa: E402
from loopline.components import feature_plan, world  # noqa: E402
from loopline.job_processes import start_feature_job, stop_process_group  # noqa: E402
from streams.producer import EventProducer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events: under a minute")
    parser.add_argument("--events", type=int, default=None, help="backlog events (default 200,000; quick 100,000)")
    args = parser.parse_args()
    events = args.events or (100_000 if args.quick else 200_000)
    console, began = Console(), time.monotonic()
    with private_stack(console, "loopline-rebuild-") as settings:
        plan = feature_plan(settings)
        topic = plan.views[0].topic
        start_ms = int(time.time() * 1000) - 3_600_000
        backlog = []
        for emitted in world(settings, 500.0, seed=3, start_ms=start_ms, malformed_rate=0.0):
            if emitted.topic == topic and emitted.record is not None:
                backlog.append(emitted)
                if len(backlog) == events:
                    break
        with Progress(console=console) as progress:
            task = progress.add_task(f"publishing {events:,} events", total=events)
            EventProducer(settings.kafka.bootstrap).publish(backlog, on_progress=lambda n: progress.update(task, completed=n))
        writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        redis, key = writer.redis, views_key(writer.project)
        for view in plan.views:  # a previous plan serves every view: the job rebuilds them all into new generations
            stored = writer.layout.views[view.name].stored_name
            previous = Generation(view.name, 0, stored, "previous-plan", view.entity_keys, view.aggregations)
            redis.hset(key, SERVING + view.name, previous.to_json())
        log = Path(settings.home) / "rebuild-job.log"
        started = time.monotonic()
        job = start_feature_job(settings, log, restore=False)
        try:
            wanted = {view.name: plan.rows_identity(view) for view in plan.views}

            def states():
                return read_view_states(redis, writer.project)

            first: list[int] = []

            def running() -> bool:
                current = states()
                published = bool(current.pending) and all(g.namespace in current.progress for g in current.pending.values())
                if published:
                    first.append(min(current.progress[g.namespace][0] for g in current.pending.values()))
                return job.poll() is not None or published or all(current.serving[v].identity == i for v, i in wanted.items())

            with console.status("the job starts"):
                if not wait_until(running, 300, 0.05) or job.poll() is not None:
                    raise SystemExit(f"the job did not start; see {log}")
            reading = time.monotonic()
            if not first:  # switched before its first progress was seen: the rate cannot be timed, the switch can
                untimed = {
                    "events": events,
                    "events_counted": 0,
                    "rebuild_events_per_s": None,
                    "rebuild_s": None,
                    "switch_after_start_s": round(reading - started, 1),
                    "why_no_rate": "switched before the first progress of the rebuilt rows: use more --events",
                }
                report(console, "rebuild under a changed plan", args.quick, untimed, {}, began)
                return

            def switched() -> bool:
                serving = states().serving
                return job.poll() is not None or all(serving[v].identity == i for v, i in wanted.items())

            with console.status("rebuilding"):
                if not wait_until(switched, 1_800, 0.05) or job.poll() is not None:
                    raise SystemExit(f"the rebuild did not finish; see {log}")
            done = time.monotonic()
        finally:
            stop_process_group(job)
    times = sorted(getattr(emitted.record, plan.views[0].time_field) for emitted in backlog)
    counted = events - bisect.bisect_right(times, first[0])
    figures = {
        "events": events,
        "events_counted": counted,
        "rebuild_events_per_s": round(counted / (done - reading)),
        "rebuild_s": round(done - reading, 1),
        "switch_after_start_s": round(done - started, 1),
    }
    report(console, "rebuild under a changed plan", args.quick, figures, {}, began)


if __name__ == "__main__":
    main()
