"""Fault injection under load, the long version: several kill -9s of each part of the loop, at random moments.

On a private stack (127.0.0.1 only), with transactions, Kafka score requests and HTTP requests
flowing, the drill (``loopline/scenarios/fault_drill.py``) kills and restarts in turn the Kafka broker, Redis,
the feature job and the Kafka-door scorer, then lets everything drain and counts: requests lost or
scored twice, entities whose online features differ from the offline recompute, HTTP answers
during the Redis outages, and each fault's time to recover (from the restart until the part works
again). The anchor is the promise itself: 0 lost, 0 duplicated, 0 mismatches. Machine: the 2-core
box this runs on, everything on it. The last line printed is one JSON object.

    python benchmarks/faults.py [--quick] [--rounds N] [--seed S]

``--quick`` (within about a minute after start-up) kills Redis and the Kafka-door scorer once each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import private_stack, report  # noqa: E402  (this folder)
from loopline.scenarios.fault_drill import FAULT_KINDS, FETCH_SLACK_MS, FaultDrill  # noqa: E402

console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two faults (Redis, the Kafka-door scorer), within about a minute")
    parser.add_argument("--rounds", type=int, default=3, help="faults of each kind (full run)")
    parser.add_argument("--seed", type=int, default=7, help="the random moments and order")
    args = parser.parse_args()
    kinds, rounds = (("redis", "kafka_scorer"), 1) if args.quick else (FAULT_KINDS, args.rounds)

    began = time.monotonic()
    with private_stack(console, "loopline-faults-") as settings:
        drill = FaultDrill(
            settings,
            Path(tempfile.mkdtemp(prefix="loopline-drill-")),
            faults_per_kind=rounds,
            kinds=kinds,
            seed=args.seed,
            on_progress=console.print,
        )
        result = drill.run()
    figures = result.figures()
    for kind in kinds:
        times = [t for t in figures.pop(f"{kind}_recovery_s") if t is not None]
        figures[f"{kind}_recovery_median_s"] = round(statistics.median(times), 2) if times else None
        figures[f"{kind}_recovery_max_s"] = max(times) if times else None
        figures[f"{kind}_not_recovered"] = rounds - len(times)
    figures["http_statuses"] = str(figures["http_statuses"])
    figures["not_live"] = ", ".join(figures["not_live"]) or "none"
    promise = "goal 0 — " + (
        "met" if not (figures["requests_lost"] or figures["requests_duplicated"] or figures["feature_mismatches"]) else "NOT met"
    )
    anchors = {
        "requests_lost": promise,
        "requests_duplicated": promise,
        "feature_mismatches": promise,
        "http_during_redis_outage_on_defaults": f"of {figures['http_during_redis_outage']}: on defaults, none hung",
        "http_during_redis_outage_within_budget": (
            f"of {figures['http_during_redis_outage']}: read ≤ budget + {FETCH_SLACK_MS:g} ms"
        ),
    }
    report(console, "fault injection under load", args.quick, figures, anchors, began)


if __name__ == "__main__":
    main()
