"""What Redis WAIT costs on the online write path: batches of feature rows written to a Redis Cluster of its own (3
masters, a replica each, 127.0.0.1 only) without and with each node's replica acknowledging them (``redis.write_acks``
0 and 1).

The rows are the job's: every feature of the fraud template's user view and each window's steps, one compare-and-set
per entity, a batch of ``--batch`` entities (the job's ``stream.max_batch_rows``) pipelined per master; with acks, each
master's pipeline ends in ``WAIT 1`` (``OnlineWriter``, which sends what the feature job's ``OnlineRowSink`` sends).
The two modes alternate batch by batch, so a busy moment of the shared machine weighs on both alike. Latency is from
a batch's start to its last reply (the writer waits for nothing else). Figures:

* ``batch_ms_p50_acks0`` / ``_acks1`` and ``batch_ms_p99_*``: per batch;
* ``rows_per_s_acks0`` / ``_acks1``: rows written per second of writing;
* ``wait_cost_ratio``: ``batch_ms_p50_acks1 / batch_ms_p50_acks0`` (computed here, no anchor).

Machine: the 2-core box this runs on. The last line printed is one JSON object with every figure.

    python benchmarks/replica_acks.py [--quick] [--batches 200] [--batch 2000]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import track

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.config import apply_definitions  # noqa: E402
from feature_store.online_write import FeatureRow, OnlineWriter  # noqa: E402
from feature_store.settings import RedisSettings  # noqa: E402
from harness import TEMPLATE, percentile, report  # noqa: E402  (this folder)
from infra.service import free_port_block  # noqa: E402
from loopline.components import build_stack, feature_plan, private_stack_settings  # noqa: E402
from loopline.project import init_project  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 batches per mode: well within a minute")
    parser.add_argument("--batches", type=int, default=None, help="batches per mode (default 200; quick 40)")
    parser.add_argument("--batch", type=int, default=2_000, help="rows per batch (the job's stream.max_batch_rows)")
    args = parser.parse_args()
    batches = args.batches or (40 if args.quick else 200)
    console, began = Console(), time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="loopline-replica-acks-"))
    settings = private_stack_settings(home, REPO / ".loopline" / "jars", init_project(home / "project", TEMPLATE))
    settings = settings.model_copy(
        update={"redis": RedisSettings(mode="cluster", port=free_port_block(6), cluster_bus_port=free_port_block(6))}
    )
    cluster = build_stack(settings).redis
    try:
        with console.status("starting a Redis Cluster of 3 masters and 3 replicas"):
            cluster.start()
            apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=True)
        view = feature_plan(settings).views[0]
        writers = {
            acks: OnlineWriter(
                settings.feast_registry_path,
                settings.redis_connection,
                settings.repo_path,
                redis_cluster=True,
                replica_acks=acks,
                replica_ack_timeout_ms=settings.redis.write_ack_timeout_ms,
            )
            for acks in (0, 1)
        }
        windows = list(writers[0].layout.views[view.name].windows)
        rng = random.Random(5)
        entities = [f"acks-u{i}" for i in range(args.batch)]
        latencies: dict[int, list[float]] = {0: [], 1: []}
        version_us = int(time.time() * 1e6)
        for _ in track(range(batches), description=f"{batches} batches of {args.batch:,} rows per mode", console=console):
            for acks in (0, 1):
                version_us += 1_000
                rows = [
                    FeatureRow(
                        view.name,
                        entity,
                        version_us,
                        {name: rng.randint(0, 50) for name in view.feature_names},
                        n + 1,
                        {w: rng.randbytes(24) for w in windows},
                    )
                    for n, entity in enumerate(entities)
                ]
                start = time.perf_counter()
                writers[acks].write(rows)
                latencies[acks].append(time.perf_counter() - start)
    finally:
        cluster.stop()
        cluster.wipe()
    figures: dict = {"batches": batches, "batch_rows": args.batch}
    for acks, values in latencies.items():
        figures[f"batch_ms_p50_acks{acks}"] = round(percentile(values, 0.5) * 1000, 2)
        figures[f"batch_ms_p99_acks{acks}"] = round(percentile(values, 0.99) * 1000, 2)
        figures[f"rows_per_s_acks{acks}"] = round(args.batch * len(values) / sum(values))
    figures["wait_cost_ratio"] = round(figures["batch_ms_p50_acks1"] / figures["batch_ms_p50_acks0"], 3)
    report(console, "Redis WAIT on the online write path", args.quick, figures, {}, began)


if __name__ == "__main__":
    main()
