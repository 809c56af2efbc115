"""The monitor's consistency replay over a big event log: a full read of the log per batch against the incremental
reader (``streams.event_log.EventLogWindow``), on a private stack (127.0.0.1 only).

N synthetic transactions (out of order and late as the producer's defaults make them) are published to the events
topic, as ``make demo`` fills it within minutes; then a batch of R sampled requests for the latest events, each
logging the recompute's own values (every feature matches: the work is the replay's, not the verdicts'). Then a
second round of M more events and a batch for them.

* ``full_read_replay_s``: the replay as it was before the incremental reader, per batch: every record since the
  longest window of any view before the batch (all N here) read and decoded (``accepted_events(read_topic(...))``),
  then ``check_consistency``; ``full_read_s`` its read and decode alone.
* ``incremental_first_s``: the monitor's replay with its reader (``EventLogWindow.events`` from
  ``events_needed_since``, then ``check_consistency``, as ``feedback_loop.consistency_replay`` runs them) on
  the first batch, which reads all N; ``incremental_second_s`` on the second batch, which reads only the M new
  records (``incremental_second_records_read``); ``*_read_s`` each call's read and decode alone.
* ``retained_mb``: the events the reader keeps between calls (``EventLogWindow.retained_bytes``).

Machine: the 2-core box this runs on. The last line printed is one JSON object.

    python benchmarks/replay_read.py [--quick]      # quick: 100,000 events (full: 400,000)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feedback_loop.consistency import by_outcome, check_consistency, events_needed_since, features_at  # noqa: E402
from harness import private_stack, report  # noqa: E402  (this folder)
from loopline.components import feature_plan, project  # noqa: E402
from loopline.project import world_of  # noqa: E402
from loopline.settings import Settings  # noqa: E402
from schemas.project import Project  # noqa: E402
from schemas.records import PredictionRecord  # noqa: E402
from streams.event_log import EventLogWindow  # noqa: E402
from streams.feature_plan import FeaturePlan  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.recompute import LATEST_EVENT, accepted_events  # noqa: E402
from streams.topics import read_topic  # noqa: E402

console = Console()
RATE_PER_S, REQUESTS, SECOND_ROUND = 2_000.0, 2_000, 20_000


def _publish(settings: Settings, plan: FeaturePlan, stream, count: int) -> None:
    """The next ``count`` events of the topics the plan reads (the transactions) from ``stream``, published."""
    events = []
    for emitted in stream:
        if emitted.topic in plan.topics:
            events.append(emitted)
            if len(events) == count:
                break
    EventProducer(settings.kafka.bootstrap, client_config=settings.kafka.client_config).publish(events)


def _accepted(settings: Settings, plan: FeaturePlan, since_ms: int | None = None) -> dict[str, pd.DataFrame]:
    """The accepted events of each topic the plan reads (from ``since_ms`` by Kafka timestamp), read and decoded whole."""
    kafka = settings.kafka
    return {
        topic: accepted_events(plan, topic, read_topic(kafka.bootstrap, topic, kafka.client_config, since_ms=since_ms))[0]
        for topic in plan.topics
    }


def _batch(
    declared: Project, plan: FeaturePlan, accepted: dict[str, pd.DataFrame], requests: int, round_name: str
) -> list[PredictionRecord]:
    """A request 1 ms after each of the latest ``requests`` accepted scored events (the transactions), logging the
    recompute's values as of it."""
    topic = declared.spec.scored_event.topic
    time_field = plan.source(topic).time_field
    asked = accepted[topic].sort_values(time_field, kind="stable").tail(requests)
    values: dict[str, list] = {}
    row_times: dict[str, list] = {}
    for view in plan.views:
        keys = view.with_entity(asked)[view.entity_key].to_numpy()
        at = pd.DataFrame({view.entity_key: keys, "at_ms": asked[time_field].to_numpy() + 1})
        rows = features_at(view, view.with_entity(accepted[view.topic]), at)
        found = [rows.get((key, int(at_ms))) for key, at_ms in zip(at[view.entity_key], at["at_ms"], strict=True)]
        for name in view.feature_names:
            values[f"{view.name}:{name}"] = [None if row is None else row[name] for row in found]
        row_times[view.name] = [None if row is None else int(row[LATEST_EVENT]) for row in found]
    entity_keys = list(dict.fromkeys(key for view in plan.views for key in view.entity_keys))
    return [
        PredictionRecord(
            schema_version=1,
            request_id=f"{round_name}-{i}",
            entity_keys={key: event[key] for key in entity_keys},
            features={name: column[i] for name, column in values.items()},
            defaulted_features=[n for n, c in values.items() if c[i] is None],
            model_name=declared.spec.model.name,
            model_version="1",
            score=0.5,
            requested_at_ms=int(event[time_field]) + 1,
            scored_at_ms=int(event["kafka_ms"]) + 1,
            feature_row_times_ms={view: times[i] for view, times in row_times.items() if times[i] is not None},
        )
        for i, event in enumerate(asked.to_dict("records"))
    ]


def _full_read_replay(settings: Settings, plan: FeaturePlan, batch: list[PredictionRecord]) -> tuple[float, float, dict]:
    """The replay before the incremental reader: (read and decode s, whole replay s, outcomes)."""
    windowed = [f"{view.name}:{agg.name}" for view in plan.views for agg in view.aggregations if agg.window_ms]
    lookback_ms = (
        max(agg.window_ms for view in plan.views for agg in view.aggregations if agg.window_ms) + plan.out_of_orderness_ms
    )
    began = time.perf_counter()
    since = min(record.requested_at_ms for record in batch) - lookback_ms
    accepted = _accepted(settings, plan, since)
    read_s = time.perf_counter() - began
    outcomes = by_outcome(check_consistency(plan, accepted, batch, features=windowed))
    return read_s, time.perf_counter() - began, outcomes


def _incremental_replay(
    logs: dict[str, EventLogWindow], plan: FeaturePlan, batch: list[PredictionRecord]
) -> tuple[float, float, dict, float]:
    """The monitor's replay with its readers, one per topic: (read and decode s, whole replay s, outcomes, MB the readers
    keep)."""
    windowed = [f"{view.name}:{agg.name}" for view in plan.views for agg in view.aggregations if agg.window_ms]
    began = time.perf_counter()
    since = events_needed_since(plan, batch, windowed)
    accepted = {topic: log.events(since)[0] for topic, log in logs.items()}
    read_s = time.perf_counter() - began
    outcomes = by_outcome(check_consistency(plan, accepted, batch, features=windowed))
    seconds = time.perf_counter() - began
    return read_s, seconds, outcomes, sum(log.retained_bytes for log in logs.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events")
    args = parser.parse_args()
    count = 100_000 if args.quick else 400_000
    began, figures = time.monotonic(), {"load_average_1m_at_start": round(os.getloadavg()[0], 2), "events": count}
    with private_stack(console, "loopline-replay-read-") as settings:
        plan, kafka, declared = feature_plan(settings), settings.kafka, project(settings)
        span_s = (count + 2 * SECOND_ROUND) / RATE_PER_S
        stream = iter(world_of(declared, 5, int((time.time() - span_s) * 1000), rate_per_s=RATE_PER_S))
        with console.status(f"publishing {count:,} transactions"):
            _publish(settings, plan, stream, count)
        first = _batch(declared, plan, _accepted(settings, plan), REQUESTS, "first")
        logs = {topic: EventLogWindow(plan, topic, kafka.bootstrap, kafka.client_config) for topic in plan.topics}
        with console.status("replaying the first batch: full read, then the incremental reader's first call"):
            full_read_s, full_s, full_outcomes = _full_read_replay(settings, plan, first)
            first_read_s, first_s, first_outcomes, _ = _incremental_replay(logs, plan, first)
        with console.status(f"publishing {SECOND_ROUND:,} more; replaying a batch of them both ways"):
            _publish(settings, plan, stream, SECOND_ROUND)
            second = _batch(declared, plan, _accepted(settings, plan), REQUESTS, "second")
            second_full_read_s, second_full_s, second_full_outcomes = _full_read_replay(settings, plan, second)
            second_read_s, second_s, second_outcomes, retained_mb = _incremental_replay(logs, plan, second)
        second_records = sum(log.records_read for log in logs.values())
    figures |= {
        "requests_per_batch": REQUESTS,
        "full_read_s": round(full_read_s, 2),
        "full_read_replay_s": round(full_s, 2),
        "incremental_first_read_s": round(first_read_s, 2),
        "incremental_first_s": round(first_s, 2),
        "second_round_events": SECOND_ROUND,
        "second_full_read_s": round(second_full_read_s, 2),
        "second_full_read_replay_s": round(second_full_s, 2),
        "incremental_second_records_read": second_records,
        "incremental_second_read_s": round(second_read_s, 2),
        "incremental_second_s": round(second_s, 2),
        "speedup_second_batch": round(second_full_s / second_s, 1),
        "retained_mb": round(retained_mb),
        "same_outcomes": full_outcomes == first_outcomes and second_full_outcomes == second_outcomes,
        "outcomes_second": second_outcomes,
    }
    anchors = {
        "incremental_second_s": "the replay of a batch once the reader holds the log: reads only what is new",
        "full_read_replay_s": "before: every batch reads and decodes the whole window again",
    }
    report(console, "consistency replay: full read vs incremental reader", args.quick, figures, anchors, began)


if __name__ == "__main__":
    main()
