"""The skew and consistency monitor's checks, timed on this machine: no stack needed (both are pure computations over
what the monitor reads from Kafka).

1. Skew: ``feedback_loop.drift.skew_check`` over N logged rows × 30 features (24 numeric, 6 categorical) against the
   reference statistics of a 100,000-row snapshot of the same distributions (computed once, as a manifest holds
   them), one numeric feature multiplied by 2.5 in the logged rows. ``skew_check_s`` is the whole check (binning every
   value into the reference's bins, PSI, JS and L∞ for every feature); ``injected_skew_detected`` whether the shifted
   feature alerts; ``false_alerts`` how many of the other 29 warn or alert. Goal: ≤ 10 s for 1,000,000 rows.
2. The same question (which columns drifted) put to Evidently's data-drift preset (``evidently==0.7.*``: its own
   tests, Wasserstein distance for numbers and Jensen-Shannon for categories at this size) on the same rows and
   reference, in a subprocess of an interpreter that has it (EVIDENTLY_PYTHON, default
   .loopline/evidently-venv/bin/python; it pins plotly < 6, so it is not in Loopline's environment). Evidently reads
   the raw reference rows on every run, so ``evidently_vs_loopline`` divides its seconds by Loopline's check *plus*
   the reference statistics from the same rows (``skew_with_reference_s``; a manifest holds them, so the monitor
   never recomputes them); ``detections_agree`` says whether both flagged the same number of columns.
3. Consistency: ``feedback_loop.consistency.check_consistency`` replaying M logged requests (the repo's two stream
   feature views, 15 features) against the recompute of a synthetic event log with its log positions (as the monitor
   reads it: every differing value is checked against the rows of each entity's log prefixes), where the logged
   values are the recompute's own except one feature computed with its window one bucket longer (the "off by one in
   the job only" bug) and one request in ten a row behind (lag). ``consistency_rows_per_s`` is requests replayed per
   second; ``broken_feature_detected`` whether that feature (and only it) shows value mismatches; lag counts apart.
   The logged values come from the recompute itself, so this measures the replay's speed and its verdicts on planted
   faults; tests/feedback_loop/test_consistency_replay.py and tests/loopline/test_demo_loop.py run it against the real job and
   scorer. Goal: ≤ 60 s for 100,000 requests.

Machine: the 2-core box this runs on. The last line printed is one JSON object.

    python benchmarks/monitor.py [--quick]      # quick: 200,000 rows, 20,000 requests, Evidently on the same rows
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.config import repo_stream_views  # noqa: E402
from feedback_loop.consistency import by_outcome, check_consistency, features_at, summary  # noqa: E402
from feedback_loop.drift import SkewThresholds, skew_check  # noqa: E402
from feedback_loop.reference import reference_statistics  # noqa: E402
from harness import report, template_project  # noqa: E402  (this folder)
from loopline.project import world_of  # noqa: E402
from schemas.project import Project  # noqa: E402
from schemas.records import PredictionRecord  # noqa: E402
from streams.feature_plan import FeaturePlan, compile_plan  # noqa: E402
from streams.recompute import LATEST_EVENT  # noqa: E402

console = Console()
NUMERIC, CATEGORICAL, REFERENCE_ROWS = 24, 6, 100_000
SHIFTED = "f00"
BROKEN = "user_transaction_features:txn_count_1h"
EVIDENTLY_PYTHON = os.environ.get("EVIDENTLY_PYTHON", str(REPO / ".loopline" / "evidently-venv" / "bin" / "python"))
EVIDENTLY_SCRIPT = """
import sys, time, pandas as pd
from evidently import Report
from evidently.presets import DataDriftPreset
reference, current = pd.read_parquet(sys.argv[1]), pd.read_parquet(sys.argv[2])
began = time.perf_counter()
result = Report([DataDriftPreset()]).run(current_data=current, reference_data=reference)
seconds = time.perf_counter() - began
drifted = next(m["value"]["count"] for m in result.dict()["metrics"] if m["metric_name"].startswith("DriftedColumnsCount"))
print(seconds, int(drifted))
"""


def _columns(rows: int, rng: np.random.Generator, shift: float = 1.0) -> pd.DataFrame:
    """30 features: lognormal amounts, Poisson counts and uniform hours among the numbers; five-valued categories."""
    data = {}
    for i in range(NUMERIC):
        kind = i % 3
        values = (
            rng.lognormal(3 + i % 5, 1, rows)
            if kind == 0
            else rng.poisson(2 + i, rows).astype(float)
            if kind == 1
            else rng.uniform(0, 24, rows)
        )
        data[f"f{i:02d}"] = values * (shift if f"f{i:02d}" == SHIFTED else 1.0)
    for i in range(CATEGORICAL):
        data[f"c{i:02d}"] = rng.choice(["web", "app", "pos", "phone", "kiosk"], rows, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    return pd.DataFrame(data)


def _skew(rows: int, figures: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    reference_rows, logged = _columns(REFERENCE_ROWS, rng), _columns(rows, rng, shift=2.5)
    as_objects = reference_rows.astype({f"c{i:02d}": object for i in range(CATEGORICAL)})
    began = time.perf_counter()
    reference = reference_statistics(as_objects, list(reference_rows.columns))
    statistics_s = time.perf_counter() - began
    columns = {name: logged[name].to_numpy() for name in logged.columns}
    began = time.perf_counter()
    skews = skew_check(reference, columns)
    seconds = time.perf_counter() - began
    levels = {s.feature: s.level(SkewThresholds()) for s in skews}
    figures |= {
        "skew_rows": rows,
        "skew_features": len(skews),
        "skew_check_s": round(seconds, 3),
        "skew_with_reference_s": round(seconds + statistics_s, 3),
        "skew_rows_per_s": round(rows / seconds),
        "injected_skew_detected": levels[SHIFTED] == "alert",
        "injected_skew_psi": round(next(s.psi for s in skews if s.feature == SHIFTED), 3),
        "false_alerts": sum(level != "ok" for name, level in levels.items() if name != SHIFTED),
    }
    return reference_rows, logged


def _evidently(reference: pd.DataFrame, logged: pd.DataFrame, figures: dict) -> None:
    if not Path(EVIDENTLY_PYTHON).exists():
        figures |= {"evidently_s": None, "evidently_vs_loopline": None}
        figures["evidently_note"] = (
            f"no {EVIDENTLY_PYTHON}: python3 -m venv .loopline/evidently-venv && .../pip install 'evidently==0.7.*'"
        )
        return
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / "reference.parquet", Path(folder) / "current.parquet"]
        reference.to_parquet(paths[0]), logged.to_parquet(paths[1])
        try:
            done = subprocess.run(
                [EVIDENTLY_PYTHON, "-c", EVIDENTLY_SCRIPT, *map(str, paths)], capture_output=True, text=True, timeout=1800
            )
        except subprocess.TimeoutExpired:
            figures |= {"evidently_s": None, "evidently_vs_loopline": None, "evidently_note": "did not finish within 30 min"}
            return
    if done.returncode != 0:
        figures |= {
            "evidently_s": None,
            "evidently_vs_loopline": None,
            "evidently_note": done.stderr.strip().splitlines()[-1][:200],
        }
        return
    seconds, drifted = done.stdout.split()[-2:]
    loopline_flagged = int(figures["injected_skew_detected"]) + figures["false_alerts"]
    figures |= {
        "evidently_s": round(float(seconds), 2),
        "evidently_vs_loopline": round(float(seconds) / figures["skew_with_reference_s"], 1),
        "evidently_columns_drifted": int(drifted),
        "detections_agree": int(drifted) == loopline_flagged,
    }


def _events(project: Project, plan: FeaturePlan, count: int) -> pd.DataFrame:
    """A synthetic event log of ``count`` events of the scored topic (the transactions) in event-time order, with the
    log positions the monitor reads with them (``accepted_events``: partition, offset in send order, ``kafka_ms`` the
    send time), so the replay tells lag from value mismatches over each entity's log prefixes, as it does in the
    monitor. Sent in event-time order (no out-of-order events): a planted lagging row, the entity's previous event's,
    is then a log prefix's row."""
    topic = project.spec.scored_event.topic
    world = world_of(
        project, 3, 1_790_000_000_000, users=2_000, merchants=300, rate_per_s=5.0, out_of_order_rate=0.0, late_rate=0.0
    )
    records = []
    for emitted in world:
        if emitted.record is not None and emitted.topic == topic:
            records.append(
                {**emitted.record.model_dump(), "partition": 0, "offset": len(records), "kafka_ms": emitted.emit_at_ms}
            )
            if len(records) == count:
                break
    return pd.DataFrame(records).sort_values(plan.source(topic).time_field, kind="stable").reset_index(drop=True)


def _logged(project: Project, plan: FeaturePlan, events: pd.DataFrame, requests: int) -> list[PredictionRecord]:
    """A request 1 ms after each of the last ``requests`` events, logging the recompute's values — the broken feature's
    with its window one bucket longer, and every tenth request's as of the entity's previous event (lag)."""
    asked = events.tail(requests)
    time_field = plan.source(project.spec.scored_event.topic).time_field
    event_times = asked[time_field].to_numpy()
    features: dict[str, list] = {}
    row_times: dict[str, list] = {}
    absorbed: dict[str, list] = {}  # the log positions behind each row, as the job writes them with it
    for view in plan.views:
        logged = view.with_entity(events).groupby(view.entity_key, sort=False)
        history = {key: (group[time_field].to_numpy(), group["offset"].to_numpy()) for key, group in logged}
        broken = replace(
            view,
            aggregations=tuple(
                replace(a, window_ms=a.window_ms + a.slide_ms) if f"{view.name}:{a.name}" == BROKEN else a
                for a in view.aggregations
            ),
        )
        at = pd.DataFrame({view.entity_key: view.with_entity(asked)[view.entity_key].to_numpy(), "at_ms": event_times})
        lagged = at.copy()
        lagged["at_ms"] = np.where(np.arange(len(at)) % 10 == 0, lagged["at_ms"] - 1, lagged["at_ms"])
        rows = features_at(broken, view.with_entity(events), lagged)
        for key, at_ms in zip(lagged[view.entity_key], lagged["at_ms"], strict=True):
            found = rows.get((key, int(at_ms)))
            for name in view.feature_names:
                features.setdefault(f"{view.name}:{name}", []).append(None if found is None else found[name])
            row_times.setdefault(view.name, []).append(None if found is None else int(found[LATEST_EVENT]))
            times, offsets = history.get(key, ((), ()))
            behind = int(np.searchsorted(times, at_ms, side="right"))  # sent in time order: the row's events are a prefix
            absorbed.setdefault(view.name, []).append(f"0:{offsets[behind - 1]}" if behind else None)
    keys = list(dict.fromkeys(key for view in plan.views for key in view.entity_keys))
    records = []
    for i, (_, event) in enumerate(asked.iterrows()):
        values = {name: column[i] for name, column in features.items()}
        records.append(
            PredictionRecord(
                schema_version=1,
                request_id=f"bench-{i}",
                entity_keys={key: event[key] for key in keys},
                features=values,
                defaulted_features=[n for n, v in values.items() if v is None],
                model_name=project.spec.model.name,
                model_version="1",
                score=0.5,
                requested_at_ms=int(event_times[i]) + 1,
                scored_at_ms=int(event["kafka_ms"]) + 2,
                feature_row_times_ms={view: times[i] for view, times in row_times.items() if times[i] is not None},
                feature_row_absorbed={view: positions[i] for view, positions in absorbed.items() if positions[i] is not None},
            )
        )
    return records


def _consistency(requests: int, figures: dict) -> None:
    project = template_project()
    plan = compile_plan(repo_stream_views(project.feature_repo), project)
    events = _events(project, plan, requests + 20_000)
    with console.status(f"logging {requests:,} requests (recompute, one feature's window one bucket long)"):
        logged = _logged(project, plan, events, requests)
    with console.status(f"replaying {requests:,} requests against the recompute"):
        began = time.perf_counter()
        report_ = check_consistency(plan, {project.spec.scored_event.topic: events}, logged)
        seconds = time.perf_counter() - began
    table = summary(report_)
    mismatched = sorted(name for name, row in table.items() if row["mismatch_ratio"] > 0)
    figures |= {
        "consistency_requests": requests,
        "consistency_check_s": round(seconds, 2),
        "consistency_rows_per_s": round(requests / seconds),
        "broken_feature_detected": mismatched == [BROKEN],
        "broken_feature_mismatch_ratio": round(table[BROKEN]["mismatch_ratio"], 3),
        "consistency_outcomes": by_outcome(report_),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 rows and 20,000 requests")
    args = parser.parse_args()
    rows, requests = (200_000, 20_000) if args.quick else (1_000_000, 100_000)
    began, figures = time.monotonic(), {"load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    with console.status(f"skew check over {rows:,} rows x 30 features"):
        reference, logged = _skew(rows, figures)
    with console.status(f"Evidently's data-drift preset on the same {rows:,} rows"):
        _evidently(reference, logged, figures)
    _consistency(requests, figures)
    anchors = {
        "skew_check_s": f"goal ≤ 10 s for 1,000,000 rows — "
        f"{'met' if figures['skew_check_s'] * 1_000_000 / rows <= 10 else 'NOT met'}"
        + (" (extrapolated from the quick run)" if args.quick else ""),
        "evidently_vs_loopline": "Evidently's seconds / Loopline's check + reference statistics, same rows and reference",
        "false_alerts": "goal 0 of 29 unshifted features",
        "consistency_check_s": f"goal ≤ 60 s for 100,000 requests — "
        f"{'met' if figures['consistency_check_s'] * 100_000 / requests <= 60 else 'NOT met'}"
        + (" (extrapolated from the quick run)" if args.quick else ""),
    }
    report(console, "skew and consistency checks", args.quick, figures, anchors, began)


if __name__ == "__main__":
    main()
