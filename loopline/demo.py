"""``make demo``: the loop so far, end to end on the local stack, in bounded time."""

from __future__ import annotations

import json
import time

from rich.console import Console

from loopline.components import build_stack
from loopline.produce import produce_stream
from loopline.settings import Settings
from loopline.views import counts_table, stack_table, topics_table
from schemas.records import DeadLetterRecord
from schemas.topics import DEAD_LETTERS, LABELS, TOPICS, TRANSACTIONS
from streams.topics import apply_topics, topic_sizes
from streams.validating_consumer import ValidatingConsumer

#: Seconds kept back from the budget for validating and reporting.
_REPORT_RESERVE_S = 8.0
#: The demo's producer sends a few broken records on purpose, to show dead-lettering.
_DEMO_MALFORMED_RATE = 0.002


def run_demo(settings: Settings, seconds: float, rate: float, console: Console) -> None:
    """Stack up, topics, produce for the rest of the budget, validate everything, report."""
    began = time.monotonic()
    stack = build_stack(settings)
    console.rule("1. local stack")
    reports = stack.up()
    console.print(stack_table(stack.status(), reports))

    console.rule("2. topics")
    bootstrap = settings.kafka.bootstrap_servers
    console.print(topics_table(apply_topics(bootstrap, TOPICS)))

    duration = max(5.0, seconds - (time.monotonic() - began) - _REPORT_RESERVE_S)
    console.rule(f"3. producing {rate:,.0f} transactions/s for {duration:.0f} s")
    stats = produce_stream(
        settings, rate, duration, seed=int(time.time()), start="now", console=console, malformed_rate=_DEMO_MALFORMED_RATE
    )

    console.rule("4. validating (bad records go to the dead-letter topic)")
    dead_letters: list[DeadLetterRecord] = []
    validator = ValidatingConsumer(bootstrap, "loopline-demo-validator", [TRANSACTIONS, LABELS], DEAD_LETTERS.name)
    try:
        counts = validator.run_until_caught_up(timeout_s=60.0)
    finally:
        validator.close()
    dlq = ValidatingConsumer(bootstrap, "loopline-demo-dlq-reader", [DEAD_LETTERS], DEAD_LETTERS.name)
    try:
        counts |= dlq.run_until_caught_up(
            timeout_s=30.0,
            on_valid=lambda _topic, record: dead_letters.append(record),  # type: ignore[arg-type]
        )
    finally:
        dlq.close()
    console.print(counts_table(stats.delivered, counts, topic_sizes(bootstrap, [t.name for t in TOPICS])))
    for record in dead_letters[:3]:
        console.print(
            f"  dead letter from {record.source_topic}[{record.source_partition}]@{record.source_offset}: {record.error}",
            highlight=False,
        )

    elapsed = time.monotonic() - began
    summary = {
        "seconds": round(elapsed, 1),
        "delivered": stats.total,
        "events_per_s": round(stats.total / max(stats.seconds, 1e-9)),
        "valid": sum(c.valid for t, c in counts.items() if t != DEAD_LETTERS.name),
        "dead_lettered": sum(c.dead_lettered for c in counts.values()),
    }
    console.rule("summary")
    console.print(json.dumps(summary))
    console.print("The stack is still up for exploring (`loopline stack status`); `make down` stops it.")
