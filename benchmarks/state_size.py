"""The feature job's state stays bounded, on a private embedded stack (127.0.0.1 only): the checkpoint of a million
entities with one event each, before and after their windows have passed.

The fraud template's users view keeps a user until every window is empty for good: its longest window is a day, and
its ``time_since_previous`` looks back the view's ttl (two days). A million transactions, each of its own user (of ten
merchants), are published stamped three days ago, a millisecond apart; the job absorbs them and checkpoints. Then
transactions of other users two days and a minute after the last of them move every partition past them, and each of the million
leaves the state at its next check (``stream.state_check_ms``, 20 s here). It measures

* ``checkpoint_bytes_full``: the job's checkpoint once the million are absorbed (and the rows held for the offline log
  released);
* ``checkpoint_bytes_after``: its checkpoint once they have left (the first below a tenth of the full one);
* ``bytes_per_entity``: (full - after) / entities; ``after_over_full``: the ratio;
* ``left_after_s``: from publishing the later transactions to that checkpoint.

No anchor: Flink's state TTL documents the mechanism, not a size. Machine: the 2-core box this runs on. The last line
printed is one JSON object with every figure.

    python benchmarks/state_size.py [--quick] [--entities 1000000]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.online_read import OnlineReader  # noqa: E402
from harness import private_stack, report, template_project  # noqa: E402  (this folder)
from infra.service import wait_until  # noqa: E402
from loopline.components import feature_plan, world  # noqa: E402
from loopline.job_processes import start_feature_job, stop_process_group  # noqa: E402
from streams.flink_job import checkpoint_bytes, latest_checkpoint  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.world import Emitted  # noqa: E402

DAY_MS = 86_400_000
VIEW = "user_transaction_features"
#: Checkpoints every 10 s (a heap checkpoint copies the whole state), each entity checked for leaving every 20 s at most
#: (a check costs a few microseconds: a million entities checked every 2 s would keep a core busy).
JOB_ENV = {"LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS": "10000", "LOOPLINE_STREAM__STATE_CHECK_MS": "20000"}


def _one_event_users(settings, count: int, first: int, start_ms: int) -> list[Emitted]:
    """``count`` transactions of the synthetic stream, each given a user of its own (``u<first + n>``), a millisecond
    apart from ``start_ms``."""
    project, topic = template_project(), feature_plan(settings).views[0].topic
    stream = (
        e.record for e in world(settings, 500.0, seed=9, start_ms=start_ms, malformed_rate=0.0) if e.topic == topic and e.record
    )
    base = list(itertools.islice(stream, 1_000))
    made = []
    for n in range(count):
        record = base[n % len(base)].model_copy(
            update={"user_id": f"u{first + n}", "event_id": f"e{first + n}", "event_time_ms": start_ms + n}
        )
        made.append(Emitted(topic, record.user_id, project.encode(topic, record), start_ms + n, record))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 entities: under a minute")
    parser.add_argument("--entities", type=int, default=None, help="one-event entities (default 1,000,000; quick 50,000)")
    args = parser.parse_args()
    entities = args.entities or (50_000 if args.quick else 1_000_000)
    console, began = Console(), time.monotonic()
    with private_stack(console, "loopline-state-") as settings:
        start_ms = int(time.time() * 1000) - 3 * DAY_MS
        with console.status(f"making {entities:,} one-event users"):
            once = _one_event_users(settings, entities, 0, start_ms)
        with Progress(console=console) as progress:
            task = progress.add_task(f"publishing {entities:,} events", total=entities)
            EventProducer(settings.kafka.bootstrap).publish(once, on_progress=lambda n: progress.update(task, completed=n))
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path, states_refresh_s=0.1)
        log = Path(settings.home) / "state-job.log"
        job = start_feature_job(settings, log, **JOB_ENV)
        try:
            with console.status("the job absorbs them"):
                absorbed = lambda: job.poll() is not None or (reader.progress_ms(VIEW) or 0) >= start_ms + entities - 1  # noqa: E731
                if not wait_until(absorbed, 1_800, 0.5) or job.poll() is not None:
                    raise SystemExit(f"the job did not absorb the events; see {log}")
                released = time.time() + 6  # the rows held for the offline log (5 s) are in the checkpoints until then
                if not wait_until(lambda: latest_checkpoint(settings.checkpoint_dir, released), 120, 0.2):
                    raise SystemExit(f"no checkpoint completed; see {log}")
            full = checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir))
            later = _one_event_users(settings, 200, entities, start_ms + entities + 2 * DAY_MS + 60_000)  # past the last of them
            published = time.monotonic()
            EventProducer(settings.kafka.bootstrap).publish(later)
            with console.status("the windows pass: the users leave the state"):
                left = lambda: job.poll() is not None or checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir)) < full / 10  # noqa: E731
                if not wait_until(left, 600, 0.2) or job.poll() is not None:
                    raise SystemExit(f"the state did not shrink to a tenth; see {log}")
            left_after = time.monotonic() - published
            after = checkpoint_bytes(latest_checkpoint(settings.checkpoint_dir))
        finally:
            stop_process_group(job)
    figures = {
        "entities": entities,
        "checkpoint_bytes_full": full,
        "checkpoint_bytes_after": after,
        "bytes_per_entity": round((full - after) / entities, 1),
        "after_over_full": round(after / full, 4),
        "left_after_s": round(left_after, 1),
    }
    report(console, "state of one-event entities before and after their windows", args.quick, figures, {}, began)


if __name__ == "__main__":
    main()
