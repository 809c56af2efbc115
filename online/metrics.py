"""The scorer's Prometheus metrics (``loopline_scoring_*``), on a collector registry of its own."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, values

# Importing Feast sets PROMETHEUS_MULTIPROC_DIR for its own feature server, which switches every
# metric of the process (and of its children, through the environment) to values kept in shared
# files: slower on every increment, and shared by name across registries, so two scorers would
# count into each other. The scorer exports its own collector registry, so its values stay in process.
values.ValueClass = values.MutexValue

#: Stage latencies span 50 µs (a cached read) to 0.5 s (an overloaded queue).
_LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
#: Per-version latency is compared canary against prod by a ratio (1.5× by default): its bounds are 1.25× apart (the R10
#: series, 0.25 ms to 2.5 s), so a p99 read from it moves by less than that ratio when a bucket bound is crossed.
_R10 = (1.0, 1.25, 1.6, 2.0, 2.5, 3.15, 4.0, 5.0, 6.3, 8.0)
_MODEL_LATENCY_BUCKETS = tuple(round(m * 10.0**e, 9) for e in range(-4, 1) for m in _R10 if 0.00025 <= m * 10.0**e <= 2.5)
STAGES = ("feature_fetch", "queue_wait", "inference", "total")
#: Why a registered model version was refused: its artifact is not the one registered, or it is no loadable model.
REFUSAL_REASONS = ("artifact", "invalid_model")


@dataclass(frozen=True)
class VersionMetrics:
    """What one model version under one alias counts: requests scored (ok), failed (error), their latency."""

    ok: Counter
    error: Counter
    latency: Histogram


class ScorerMetrics:
    """Requests, errors, per-stage latency, batch sizes, queue depth, defaulted features, cache hits, models."""

    def __init__(self, collector_registry: CollectorRegistry | None = None) -> None:
        self.collector_registry = collector_registry or CollectorRegistry()
        self.requests = Counter(
            "loopline_scoring_requests",
            "Score requests by front door and outcome.",
            ["door", "status"],
            registry=self.collector_registry,
        )
        self.stage_seconds = Histogram(
            "loopline_scoring_stage_seconds",
            "Latency of each scoring stage.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=self.collector_registry,
        )
        self.batch_size = Histogram(
            "loopline_scoring_batch_size",
            "Requests per model call.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.collector_registry,
        )
        self.queue_depth = Gauge(
            "loopline_scoring_queue_depth", "Requests waiting for a batch.", registry=self.collector_registry
        )
        self.features = Counter("loopline_scoring_features", "Features fed to models.", registry=self.collector_registry)
        self.defaulted_features = Counter(
            "loopline_scoring_defaulted_features",
            "Features that fell back to their declared default.",
            registry=self.collector_registry,
        )
        self.stale_features = Counter(
            "loopline_scoring_stale_features",
            "Features read as of their view's progress, not the request's time: the feature job lagged (the prediction record "
            "names them).",
            registry=self.collector_registry,
        )
        self.feature_view_lag = Gauge(
            "loopline_feature_view_lag_seconds",
            "How far behind the clock each feature view's job has absorbed its events, as the scorer last read its progress.",
            ["view"],
            multiprocess_mode="max",
            registry=self.collector_registry,
        )
        self.feature_fallbacks = Counter(
            "loopline_scoring_feature_fallbacks",
            "Requests scored on all-default features because the read failed, by reason (over_budget, unavailable, no_entity).",
            ["reason"],
            registry=self.collector_registry,
        )
        self.cache_requests = Counter(
            "loopline_scoring_cache_requests",
            "Result cache lookups by result (hit, miss).",
            ["result"],
            registry=self.collector_registry,
        )
        self.prediction_log_failures = Counter(
            "loopline_scoring_prediction_log_failures", "Prediction records Kafka did not take.", registry=self.collector_registry
        )
        self.model = Info(
            "loopline_scoring_model", "The model version serving under each alias.", ["alias"], registry=self.collector_registry
        )
        # Per model version, what a release controller compares a canary with prod by: both count from
        # the moment this scorer started the current canary (``start_comparison``), so the two arms cover
        # the same window.
        self.model_requests = Counter(
            "loopline_scoring_model_requests",
            "Requests a model version scored (ok) or failed on (error), since this scorer started the current canary.",
            ["alias", "version", "outcome"],
            registry=self.collector_registry,
        )
        self.model_latency = Histogram(
            "loopline_scoring_model_latency_seconds",
            "Scoring latency (feature fetch to score) per model version, since this scorer started the current canary.",
            ["alias", "version"],
            buckets=_MODEL_LATENCY_BUCKETS,
            registry=self.collector_registry,
        )
        self.model_swaps = Counter(
            "loopline_scoring_model_swaps",
            "Hot swaps of the model serving under an alias.",
            ["alias"],
            registry=self.collector_registry,
        )
        self.model_refusals = Counter(
            "loopline_scoring_model_refusals",
            "Registered model versions refused (artifact not as registered, or not a loadable model).",
            ["reason"],
            registry=self.collector_registry,
        )
        for reason in REFUSAL_REASONS:  # from 0, so the first refusal is an increase an alert rule can see
            self.model_refusals.labels(reason)
        # Children looked up once: a labels() call per request and metric was a tenth of a score request's own CPU.
        self.stages = {stage: self.stage_seconds.labels(stage) for stage in STAGES}
        self._versions: dict[tuple[str, str], VersionMetrics] = {}

    def version(self, alias: str, version: str) -> VersionMetrics:
        """The per-version metrics of ``version`` serving under ``alias`` (until the next ``start_comparison``)."""
        found = self._versions.get((alias, version))
        if found is None:
            found = self._versions[(alias, version)] = VersionMetrics(
                ok=self.model_requests.labels(alias, version, "ok"),
                error=self.model_requests.labels(alias, version, "error"),
                latency=self.model_latency.labels(alias, version),
            )
        return found

    def observe_batch(self, size: int, queue_left: int) -> None:
        """A batch of ``size`` started with ``queue_left`` requests still waiting."""
        self.batch_size.observe(size)
        self.queue_depth.set(queue_left)

    def start_comparison(self) -> None:
        """A canary starts: the per-version counts of every arm restart from zero (a counter reset, which
        Prometheus' ``rate``/``increase`` allow for), so canary and prod are compared over the same window
        with no baseline to keep, whenever and wherever a release controller looks."""
        with warnings.catch_warnings():  # it warns whenever PROMETHEUS_MULTIPROC_DIR is set, though our values are in process
            warnings.simplefilter("ignore", UserWarning)
            self.model_requests.clear()
            self.model_latency.clear()
            self._versions = {}

    def model_removed(self, alias: str) -> None:
        """Nothing serves under ``alias`` any more."""
        with warnings.catch_warnings():  # it warns whenever PROMETHEUS_MULTIPROC_DIR is set, though our values are in process
            warnings.simplefilter("ignore", UserWarning)
            self.model.remove(alias)
