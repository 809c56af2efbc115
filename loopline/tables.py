"""Rich tables for what the CLI shows people (and the demo prints): each function renders results it is given."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rich.table import Table

from infra.service import ServiceStatus
from infra.stack import StartReport
from streams.topics import TopicChange
from streams.validating_consumer import TopicCounts

if TYPE_CHECKING:
    from loopline.scenarios.demo_scoring import ScoringStats
    from offline_training.candidate import CandidateReport
    from offline_training.evaluation import Quality
    from offline_training.gpu_plan import ModelShape
    from offline_training.release_policy import ArmStats, Decision
    from schemas.model_registry import AliasChange

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


def prebuilds_table(built: Iterable[tuple[str, str, float]]) -> Table:
    """What setup built ahead of its first use: (what, the result, seconds) each."""
    table = Table(title="Built ahead of first use")
    for column in ("what", "result", "took"):
        table.add_column(column, justify="right" if column == "took" else "left")
    for name, made, seconds in built:
        table.add_row(name, made, f"{seconds:.1f} s")
    return table


def topics_table(changes: Iterable[TopicChange]) -> Table:
    """What ``topics apply`` did to each topic."""
    table = Table(title="Topics")
    for column in ("topic", "action", "detail"):
        table.add_column(column)
    for change in changes:
        table.add_row(change.topic, change.action, change.detail)
    return table


def counts_table(produced: Mapping[str, int], validated: Mapping[str, TopicCounts], end_offsets: Mapping[str, int]) -> Table:
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


def scoring_table(recent: ScoringStats | None, total: ScoringStats | None, title: str) -> Table:
    """The scorer as its prediction log shows it, the last few seconds and the whole run: latencies are
    p50/p99 in the scorer and from request to readable prediction (e2e); "model" counts the requests
    each version scored; "defaults" is the share of features that took their default, "over budget"
    the share of requests whose feature read overran its budget (all their features defaulted)."""
    table = Table(title=title)
    for column in ("", "req/s", "scorer ms", "e2e ms", "batch", "model", "defaults", "over budget"):
        table.add_column(column, justify="left" if column in ("", "model") else "right")
    for label, stats in (("last 5s", recent), ("run", total)):
        if stats is None:
            table.add_row(label, *["—"] * 7)
            continue
        table.add_row(
            label,
            f"{stats.requests_per_s:,.0f}",
            f"{stats.scorer_p50_ms:.0f}/{stats.scorer_p99_ms:.0f}",
            f"{stats.end_to_end_p50_ms:.0f}/{stats.end_to_end_p99_ms:.0f}",
            "—" if stats.mean_batch is None else f"{stats.mean_batch:.1f}",
            " ".join(f"v{version}:{count:,}" for version, count in stats.versions.items()),
            f"{stats.defaulted_rate:.0%}",
            "—" if stats.over_budget_rate is None else f"{stats.over_budget_rate:.0%}",
        )
    return table


def snapshot_table(manifests, title: str) -> Table:
    """One row per snapshot: id, kind, rows, label balance, the time its examples span, features."""
    from feedback_loop.snapshots import time_range_label

    table = Table(title=title)
    for column in ("snapshot", "kind", "rows", "labels", "scored", "features"):
        table.add_column(column, justify="right" if column == "rows" else "left")
    for m in manifests:
        labels = f"{m.label_kind}: " + ", ".join(f"{n:,} {what}" for what, n in m.label_balance.items())
        table.add_row(m.snapshot_id, m.kind, f"{m.rows:,}", labels, time_range_label(m), str(len(m.features)))
    return table


def snapshot_diff_table(diff: dict) -> Table:
    """Per shared feature: the mean in each snapshot, the missing rates, and the PSI of the second against the first."""
    a, b = diff["snapshots"]
    table = Table(
        title=f"{b} against {a}: rows {diff['rows'][0]:,} → {diff['rows'][1]:,}; "
        f"added {diff['features_added'] or 'none'}, removed {diff['features_removed'] or 'none'}"
    )
    for column in ("feature", "mean", "missing", "PSI"):
        table.add_column(column, justify="left" if column == "feature" else "right")
    for name, figures in diff["features"].items():
        means = " → ".join("—" if v is None else f"{v:,.3g}" for v in figures["mean"])
        missing = " → ".join(f"{v:.1%}" for v in figures["missing_rate"])
        table.add_row(name, means, missing, f"{figures['psi']:.3f}")
    return table


def alias_history_table(changes: Iterable[AliasChange], title: str) -> Table:
    """One row per alias change, oldest first."""
    table = Table(title=title)
    for column in ("when (UTC)", "who / what", "alias", "from", "to", "why"):
        table.add_column(column)
    for c in changes:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.at_ms / 1000))
        table.add_row(
            when,
            c.actor,
            c.alias,
            "—" if c.previous is None else f"v{c.previous}",
            "—" if c.version is None else f"v{c.version}",
            c.reason,
        )
    return table


def release_step_line(decision: Decision, canary: ArmStats, prod: ArmStats, quality: Quality) -> str:
    """One line per look of the release controller: both arms (their labeled quality by ``quality``) and the verdict."""

    def arm(name: str, stats: ArmStats) -> str:
        p99 = "—" if stats.p99_s is None else f"{stats.p99_s * 1000:.1f} ms"
        return (
            f"{name} v{stats.version}: {stats.requests} req, {stats.error_rate:.1%} errors, p99 {p99}, {stats.labeled} labeled, "
            f"{quality.describe(stats.quality)}"
        )

    return f"{arm('canary', canary)} | {arm('prod', prod)} → {decision.action}: {decision.reason}"


def candidate_table(report: CandidateReport, name: str) -> Table:
    """A trained candidate against prod on the same holdout rows, and its INT8 version when one was tried (with latency)."""
    from offline_training.model_card import METRIC_LABELS

    comparison, quantization = report.comparison, report.quantization
    columns = {"candidate": comparison.candidate}
    if comparison.prod_version is not None:
        columns[f"prod v{comparison.prod_version}"] = comparison.prod or {}
    if quantization is not None:
        columns["INT8 " + ("kept" if quantization.kept else "refused")] = quantization.int8
    binary = comparison.label_kind == "binary"
    table = Table(
        title=f"{name}: candidate on snapshot {comparison.snapshot_id}, {comparison.holdout_rows:,} holdout rows"
        + (f" ({comparison.holdout_positives:,} positive), threshold {comparison.threshold:g}" if binary else "")
    )
    table.add_column("metric")
    for column in columns:
        table.add_column(column, justify="right")

    def number(value: float | None, digits: int = 4) -> str:
        return "—" if value is None or value != value else f"{value:.{digits}f}"  # NaN != NaN

    for key, label in METRIC_LABELS[comparison.label_kind].items():
        table.add_row(label, *(number(metrics.get(key)) for metrics in columns.values()))
    if quantization is not None:
        for label, field in (("latency median ms", "median_ms"), ("latency p99 ms", "p99_ms")):
            fp32, int8 = getattr(quantization.fp32_latency, field), getattr(quantization.int8_latency, field)
            table.add_row(label, number(fp32, 3), *(["—"] if comparison.prod_version is not None else []), number(int8, 3))
    return table


def flink_jobs_table(jobs: Iterable[dict], jobmanager: str) -> Table:
    """One row per job of the Flink cluster at ``jobmanager`` (``infra/flink_cluster.list_jobs``): id, name, state, start."""
    table = Table(title=f"Flink jobs at {jobmanager}")
    for column in ("job", "name", "state", "started"):
        table.add_column(column)
    for job in jobs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job["start_ms"] / 1000))
        table.add_row(job["id"], job["name"], job["state"], started)
    return table


def gpu_plan_tables(
    shape: ModelShape, precision: str, serve_precision: str, batch: int, seq_len: int, serve_batch: int, recompute: bool
) -> tuple[Table, Table, Table]:
    """``plan-gpu``'s estimates for ``shape``: training memory per GPU for each ZeRO stage (on 8 GPUs, and the total on
    1), the fewest GPUs of each type that fit the training, and the fewest that serve it (weights and KV cache)."""
    from offline_training.gpu_plan import GPUS, inference_memory, smallest_serving_fit, smallest_training_fit, training_memory

    length = seq_len if shape.kind == "transformer" else 1
    memory = Table(title="training memory per GPU, GB (on 8 GPUs; the last column on 1)")
    for column in ("ZeRO", "params", "grads", "Adam", "activations", "total", "total on 1"):
        memory.add_column(column, justify="right")
    fewest = Table(title="fewest GPUs that fit the training (90 % of memory usable; — none up to 1,024)")
    for column in ("ZeRO", *GPUS):
        fewest.add_column(column, justify="right")
    for stage in range(4):
        one, eight = (training_memory(shape, precision, stage, n, batch, length, recompute) for n in (1, 8))
        parts = (eight.parameters, eight.gradients, eight.optimizer, eight.activations, eight.total, one.total)
        memory.add_row(str(stage), *(f"{v / 1e9:,.2f}" for v in parts))
        counts = (smallest_training_fit(shape, precision, stage, batch, length, gpu, recompute) for gpu in GPUS)
        fewest.add_row(str(stage), *("—" if n is None else str(n) for n in counts))
    cache_len = seq_len if shape.kind == "transformer" else 0
    weights, kv_cache = inference_memory(shape, serve_precision, serve_batch, cache_len)
    serving = Table(title=f"serving in {serve_precision}: weights {weights / 1e9:,.2f} GB + KV cache {kv_cache / 1e9:,.2f} GB")
    for gpu in GPUS:
        serving.add_column(gpu, justify="right")
    counts = (smallest_serving_fit(shape, serve_precision, serve_batch, cache_len, gpu) for gpu in GPUS)
    serving.add_row(*("—" if n is None else str(n) for n in counts))
    return memory, fewest, serving
