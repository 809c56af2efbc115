"""Publishing the project's synthetic world from the command line, with a progress bar."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loopline.components import world
from loopline.settings import Settings
from streams.producer import EventProducer, PublishStats


def _parse_start(start: str) -> int:
    if start == "now":
        return int(time.time() * 1000)
    moment = datetime.fromisoformat(start)
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


def produce_stream(
    config: Settings,
    rate: float,
    duration: float,
    seed: int,
    start: str,
    console: Console,
    malformed_rate: float | None = None,
) -> PublishStats:
    """Publish the project's world for ``duration`` seconds at ``rate``, with a progress bar."""
    stream = world(config, rate, seed, _parse_start(start), malformed_rate)
    producer = EventProducer(config.kafka.bootstrap, client_config=config.kafka.client_config)
    with Progress(
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        # A world's rate may be an average over its bursts, so the total is an estimate until the end.
        task = progress.add_task("produce", total=int(rate * duration))
        stats = producer.publish(
            stream,
            rate_per_s=rate,
            duration_s=duration,
            on_progress=lambda n: progress.update(task, completed=n),
        )
        progress.update(task, total=stats.total, completed=stats.total)
        return stats
