"""``make demo``: the loop so far, end to end on the local stack, in bounded time.

Stack up → `feast apply` + topics → the streaming feature job (embedded Flink, in its own
process) → the synthetic producer → a live table of a few users' features as they update in
Redis, and of the scorer (Kafka door, model from the registry, hot-swapped a third of the way in;
``loopline/demo_scoring.py``) → every record validated (bad ones dead-lettered) → a summary.
The stack stays up.
"""

from __future__ import annotations

import json
import threading
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from feature_store.online_read import OnlineReader

from loopline.components import build_stack, synthetic_config
from loopline.demo_scoring import DemoScoring
from loopline.job_processes import start_feature_job, stop_process_group, wait_until_serving
from loopline.settings import Settings
from loopline.views import counts_table, scoring_table, stack_table, topics_table
from schemas.records import DeadLetterRecord
from schemas.topics import DEAD_LETTERS, LABELS, TOPICS, TRANSACTIONS
from streams.producer import EventProducer, PublishStats
from streams.synthetic import SyntheticStream, synthetic_user_id
from streams.topics import apply_topics, topic_sizes
from streams.validating_consumer import ValidatingConsumer

#: Seconds kept back from the budget for validating and reporting.
_REPORT_RESERVE_S = 8.0
#: The demo's producer sends a few broken records on purpose, to show dead-lettering.
_DEMO_MALFORMED_RATE = 0.002
_JOB_START_TIMEOUT_S = 120.0
#: Score requests per second the demo sends (beside the producer's transactions, on the same cores).
_SCORING_RATE = 100.0
_USER_VIEW = "user_transaction_features"
_SHOWN = ("txn_count_5m", "amount_sum_1h", "amount_max_24h", "distinct_merchants_1h", "secs_since_prev_txn")
#: The synthetic stream's most active users (Zipf ranks 0-4): their rows change every second or so.
_WATCHED_USERS = [synthetic_user_id(i) for i in range(5)]


def _features_table(reader, produced: int, elapsed_s: float) -> Table:
    now_us = time.time() * 1e6
    values = reader.get_online_features([f"{_USER_VIEW}:{f}" for f in _SHOWN], [{"user_id": u} for u in _WATCHED_USERS])
    stamps = reader.row_timestamps_us(_USER_VIEW, _WATCHED_USERS)
    table = Table(title=f"live features in Redis — {produced:,} transactions produced in {elapsed_s:.0f} s")
    for column in ("user", *_SHOWN, "row age"):
        table.add_column(column, justify="left" if column == "user" else "right")
    for index, user in enumerate(_WATCHED_USERS):
        cells = [values[f][index] for f in _SHOWN]
        age = "—" if stamps[index] is None else f"{(now_us - stamps[index]) / 1e6:.1f} s"
        table.add_row(user, *("—" if v is None else f"{v:,.2f}" if isinstance(v, float) else str(v) for v in cells), age)
    return table


def _produce_while_showing_features(
    settings: Settings, job, scoring: DemoScoring, budget_s: float, rate: float, console: Console
) -> tuple[PublishStats, OnlineReader]:
    """Wait for the job, then produce and score for the rest of the budget while live tables show
    features and scoring; a third of the way in, a new model version is promoted."""
    reader = OnlineReader(settings.registry_path, settings.redis_connection, settings.repo_path)
    waited_from = time.monotonic()
    with console.status("waiting for the feature job's first row (the mini-cluster takes ~20 s to start) and the scorer"):
        wait_until_serving(job, settings, reader, timeout_s=_JOB_START_TIMEOUT_S)
        scoring.wait_ready()
    # The wait for the job counts against the budget too.
    duration = max(5.0, budget_s - (time.monotonic() - waited_from) - _REPORT_RESERVE_S)
    stream = SyntheticStream(synthetic_config(settings, rate, _DEMO_MALFORMED_RATE), int(time.time()), int(time.time() * 1000))
    produced = [0]
    outcome: list[PublishStats] = []
    producing = threading.Thread(
        target=lambda: outcome.append(
            EventProducer(settings.kafka.bootstrap_servers, client_config=settings.kafka.client_config).publish(
                stream, rate_per_s=rate, duration_s=duration, on_progress=lambda n: produced.__setitem__(0, n)
            )
        ),
        daemon=True,
    )
    started = time.monotonic()
    producing.start()
    scoring.send_requests(duration)

    def tables() -> Group:
        elapsed_s = time.monotonic() - started
        versions = " → ".join(f"v{v}" for v in scoring.released)
        title = f"scoring over Kafka, p50/p99 — prod {versions} (hot swap a third of the way in)"
        return Group(_features_table(reader, produced[0], elapsed_s), scoring_table(*scoring.stats(), title=title))

    with Live(console=console, refresh_per_second=4) as live:
        while producing.is_alive():
            if len(scoring.released) == 1 and time.monotonic() - started >= duration / 3:
                scoring.promote_next()
            live.update(tables())
            time.sleep(0.25)
        live.update(tables())
    if not outcome:
        raise RuntimeError("the producer stopped without a result; see the lines above")
    return outcome[0], reader


def run_demo(settings: Settings, seconds: float, rate: float, console: Console) -> None:
    """Stack up, features applied, job started, produce for the rest of the budget while showing features."""
    from feature_store.config import apply_definitions

    began = time.monotonic()
    stack = build_stack(settings)
    console.rule("1. local stack")
    reports = stack.up()
    console.print(stack_table(stack.status(), reports))

    console.rule("2. feature definitions and topics")
    bootstrap = settings.kafka.bootstrap_servers
    views = apply_definitions(settings.registry_path, settings.redis_connection, settings.repo_path)
    console.print(f"feast apply: {', '.join(views)}")
    console.print(topics_table(apply_topics(bootstrap, TOPICS, settings.kafka.client_config)))

    console.rule("3. streaming feature job (PyFlink, embedded), the producer, and the scorer")
    # The demo rebuilds the job's state from the retained events, so a checkpoint left by an
    # earlier Loopline (other operators) never stands in its way.
    job = start_feature_job(settings, settings.resolved_logs_dir / "feature-job.log", restore=False)
    scoring = DemoScoring(settings, settings.home / "models", _SCORING_RATE)
    try:
        # While the job starts: the scorer (its own process, as in production) loads its model and warms up.
        scoring.start_serving(settings.resolved_logs_dir / "scorer.log")
        stats, reader = _produce_while_showing_features(
            settings, job, scoring, seconds - (time.monotonic() - began), rate, console
        )
        _, scored = scoring.stats()  # while the scorer still answers for its counters
    finally:
        scoring.stop()
        stop_process_group(job)

    console.rule("4. validating (bad records go to the dead-letter topic)")
    dead_letters: list[DeadLetterRecord] = []
    client = settings.kafka.client_config
    validator = ValidatingConsumer(bootstrap, "loopline-demo-validator", [TRANSACTIONS, LABELS], DEAD_LETTERS.name, client_config=client)
    try:
        counts = validator.run_until_caught_up(timeout_s=60.0)
    finally:
        validator.close()
    dlq = ValidatingConsumer(bootstrap, "loopline-demo-dlq-reader", [DEAD_LETTERS], DEAD_LETTERS.name, client_config=client)
    try:
        counts |= dlq.run_until_caught_up(
            timeout_s=30.0,
            on_valid=lambda _topic, record: dead_letters.append(record),  # type: ignore[arg-type]
        )
    finally:
        dlq.close()
    console.print(counts_table(stats.delivered, counts, topic_sizes(bootstrap, [t.name for t in TOPICS], client)))
    for record in dead_letters[:3]:
        console.print(
            f"  dead letter ({record.reason}, by {record.consumer}) from "
            f"{record.source_topic}[{record.source_partition}]@{record.source_offset}: {record.error}",
            highlight=False,
        )

    summary = {
        "seconds": round(time.monotonic() - began, 1),
        "delivered": stats.total,
        "events_per_s": round(stats.total / max(stats.seconds, 1e-9)),
        "valid": sum(c.valid for t, c in counts.items() if t != DEAD_LETTERS.name),
        "dead_lettered": sum(c.dead_lettered for c in counts.values()),
        "users_with_features": sum(s is not None for s in reader.row_timestamps_us(_USER_VIEW, _WATCHED_USERS)),
        "scored": sum(scored.versions.values()) if scored else 0,
        "scored_by_version": scored.versions if scored else {},
        "scorer_p99_ms": round(scored.scorer_p99_ms, 2) if scored else None,
        "defaulted_feature_rate": round(scored.defaulted_rate, 3) if scored else None,
        "over_feature_budget_rate": round(scored.over_budget_rate, 3) if scored and scored.over_budget_rate is not None else None,
    }
    console.rule("summary")
    console.print(json.dumps(summary))
    console.print(
        "The stack is still up for exploring (`loopline stack status`, `loopline stream submit` to run the"
        " feature job again); `make down` stops it."
    )
