"""Rich tables for what the CLI shows people."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.table import Table

from infra.service import ServiceStatus
from infra.stack import StartReport
from streams.topics import TopicChange
from streams.validating_consumer import TopicCounts

_STATE_STYLE = {"ready": "green", "stopped": "dim"}


def stack_table(statuses: Iterable[ServiceStatus], reports: Iterable[StartReport] = ()) -> Table:
    """One row per service: state, address, version, pid and (after ``up``) what was done and how long it took."""
    by_name = {report.name: report for report in reports}
    table = Table(title="Loopline local stack")
    for column in ("service", "state", "address", "version", "pid", "up"):
        table.add_column(column)
    for status in statuses:
        report = by_name.get(status.name)
        took = "" if report is None else f"{'started' if report.started else 'already running'} ({report.seconds:.1f} s)"
        style = _STATE_STYLE.get(status.state, "red")
        table.add_row(
            status.name,
            f"[{style}]{status.state}[/{style}]",
            status.address,
            status.version,
            str(status.pid or ""),
            took,
        )
    return table


def topics_table(changes: Iterable[TopicChange]) -> Table:
    """What ``topics apply`` did to each topic."""
    table = Table(title="Topics")
    for column in ("topic", "action", "detail"):
        table.add_column(column)
    for change in changes:
        table.add_row(change.topic, change.action, change.detail)
    return table


def counts_table(
    produced: Mapping[str, int], validated: Mapping[str, TopicCounts], end_offsets: Mapping[str, int]
) -> Table:
    """Per topic: records produced in this run, validated as good, dead-lettered, and total in the topic."""
    table = Table(title="Records per topic")
    for column in ("topic", "produced", "valid", "dead-lettered", "in topic"):
        table.add_column(column, justify="right" if column != "topic" else "left")
    for topic in sorted(set(produced) | set(validated) | set(end_offsets)):
        counts = validated.get(topic, TopicCounts())
        table.add_row(
            topic,
            f"{produced.get(topic, 0):,}",
            f"{counts.valid:,}",
            f"{counts.dead_lettered:,}",
            f"{end_offsets.get(topic, 0):,}",
        )
    return table
