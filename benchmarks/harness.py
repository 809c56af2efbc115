"""What every benchmark here needs: the domain (the fraud template's project), a private stack, percentiles, and the
report (table + last-line JSON)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from feature_store.config import apply_definitions
from loopline.components import apply_loopline_topics, build_stack, private_stack_settings
from loopline.project import init_project, template_path
from loopline.settings import Settings
from schemas.project import Project, load_project

REPO = Path(__file__).resolve().parents[1]
#: The benchmarks' domain: the project Loopline's fraud template makes (card transactions, chargebacks as labels).
TEMPLATE = "fraud"


def template_project() -> Project:
    """The benchmarks' project as Loopline ships it (read only): for what needs its domain but no stack."""
    return load_project(template_path(TEMPLATE))


@contextmanager
def private_stack(console: Console, prefix: str) -> Iterator[Settings]:
    """Kafka and Redis of the benchmark's own (free ports, 127.0.0.1), acting on a project made from ``TEMPLATE`` under
    its home (``loopline init``), topics and features applied; wiped after."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    settings = private_stack_settings(home, REPO / ".loopline" / "jars", init_project(home / "project", TEMPLATE))
    stack = build_stack(settings)
    try:
        with console.status("starting a private stack"):
            stack.up()
            apply_loopline_topics(settings)
            apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        yield settings
    finally:
        stack.down(wipe=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_loop_ms(repeats: int = 5) -> float:
    """The machine's speed now: ms for a fixed pure-Python loop (a million additions), the best of ``repeats``. The
    shared machine's speed varies from day to day (twice as slow on some); this tells runs of different days apart."""
    best = float("inf")
    for _ in range(repeats):
        began, total = time.perf_counter(), 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - began)
    return round(best * 1000, 1)


def report(console: Console, title: str, quick: bool, figures: dict, anchors: dict[str, str], began: float) -> None:
    """Print ``figures`` as a table with their anchors, then, as the last line, one JSON object of them all, with the
    machine's cores and speed (:func:`machine_loop_ms`, timed once the benchmark's load has stopped)."""
    table = Table(title=f"{title} — {os.cpu_count()} cores, {'quick' if quick else 'full'} run")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("anchor", justify="right")
    for name, value in figures.items():
        table.add_row(name, str(value), anchors.get(name, ""))
    console.print(table)
    wall_s = round(time.monotonic() - began, 1)
    print(json.dumps({**figures, "cores": os.cpu_count(), "machine_loop_ms": machine_loop_ms(), "wall_s": wall_s}))
