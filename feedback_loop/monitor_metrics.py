"""The monitor's Prometheus metrics: skew per feature and model version, consistency per feature, thresholds.

A feature's skew series exist only while its model version's window holds enough rows to judge (fewer would
alert on noise); the thresholds are exported beside them so one alert rule serves every feature's own limits.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, values

from feedback_loop.consistency import OUTCOMES, FeatureConsistency
from feedback_loop.drift import FeatureSkew, SkewThresholds
from feedback_loop.feature_log import PROBLEMS

_SKEW = ("feature", "model_version")
#: A record on the predictions topic that did not decode to its contract.
CONTRACT_VIOLATION = "contract_violation"
#: Every ``reason`` of ``loopline_monitor_bad_records_total``: the contract's, and the window's (``feature_log.py``).
BAD_RECORD_REASONS = (CONTRACT_VIOLATION, *PROBLEMS)
# The monitor imports Feast (the feature plan), which sets PROMETHEUS_MULTIPROC_DIR and so would switch every metric
# to shared files, labels that cannot be cleared included (online/metrics.py does the same for the scorer).
values.ValueClass = values.MutexValue


class MonitorMetrics:
    """Every metric the monitor exports, in a collector registry of its own."""

    def __init__(self, collector_registry: CollectorRegistry | None = None) -> None:
        self.collector_registry = collector_registry or CollectorRegistry()
        r = self.collector_registry
        self.psi = Gauge(
            "loopline_feature_psi", "Population stability index of the window against the reference.", _SKEW, registry=r
        )
        self.js = Gauge(
            "loopline_feature_js_divergence", "Jensen-Shannon divergence (base 2) of a numeric feature.", _SKEW, registry=r
        )
        self.linf = Gauge(
            "loopline_feature_linf_distance", "Largest change of one value's share (categorical).", _SKEW, registry=r
        )
        self.defaulted = Gauge(
            "loopline_feature_defaulted_ratio", "Share of requests scored with the default.", _SKEW, registry=r
        )
        self.missing = Gauge("loopline_feature_missing_ratio", "Share of requests with no value.", _SKEW, registry=r)
        self.rows = Gauge(
            "loopline_feature_window_rows", "Requests in the window (all, before the minimum is reached).", _SKEW, registry=r
        )
        self.threshold = Gauge(
            "loopline_feature_skew_threshold", "Where a feature's skew warns or alerts.", ["feature", "measure"], registry=r
        )
        self.mismatch = Gauge(
            "loopline_feature_consistency_mismatch_ratio",
            "Value mismatches against the recompute, last replay.",
            ["feature"],
            registry=r,
        )
        self.lag = Gauge(
            "loopline_feature_consistency_lag_ratio",
            "Mismatches explained by an older online row, last replay.",
            ["feature"],
            registry=r,
        )
        self.ahead = Gauge(
            "loopline_feature_consistency_ahead_ratio",
            "Mismatches explained by an online row newer than the request (event clocks ahead of the requester's), last replay.",
            ["feature"],
            registry=r,
        )
        self.consistency_missing = Gauge(
            "loopline_feature_consistency_missing_ratio", "No online value where the log had one.", ["feature"], registry=r
        )
        self.extra = Gauge(
            "loopline_feature_consistency_extra_ratio", "An online value where the log had none.", ["feature"], registry=r
        )
        self.smape = Gauge(
            "loopline_feature_consistency_smape",
            "SMAPE (0-2) of the online values against the recompute.",
            ["feature"],
            registry=r,
        )
        self.comparisons = Counter(
            "loopline_feature_consistency_comparisons_total",
            "Replayed comparisons by outcome.",
            ["feature", "outcome"],
            registry=r,
        )
        self.records = Counter("loopline_monitor_records_total", "Predictions the monitor counted.", registry=r)
        self.duplicates = Counter(
            "loopline_monitor_duplicate_records_total",
            "Predictions of a request already counted (scored again after an at-least-once scorer's crash), not counted again.",
            registry=r,
        )
        self.bad_records = Counter(
            "loopline_monitor_bad_records_total",
            f"Records on the predictions topic the monitor could not count, by reason ({', '.join(BAD_RECORD_REASONS)}).",
            ["reason"],
            registry=r,
        )
        for reason in BAD_RECORD_REASONS:  # at 0 from the start, so a rate() over it has a series before the first bad one
            self.bad_records.labels(reason)
        self.reference = Gauge(
            "loopline_monitor_reference_info", "The snapshot skew is measured against (1).", ["snapshot_id"], registry=r
        )
        self.last_check = Gauge("loopline_monitor_last_check_timestamp_seconds", "When skew was last computed.", registry=r)
        self.last_replay = Gauge(
            "loopline_monitor_last_replay_timestamp_seconds", "When the consistency replay last ran.", registry=r
        )
        self._published: set[tuple[str, str]] = set()
        self._counted: set[tuple[str, str]] = set()

    def publish_skews(
        self, skews: Mapping[str, list[FeatureSkew]], min_rows: int, thresholds: Mapping[str, SkewThresholds], reference_id: str
    ) -> None:
        """Set the skew series of every (feature, version) with at least ``min_rows`` rows; remove the others."""
        with warnings.catch_warnings():  # it warns whenever PROMETHEUS_MULTIPROC_DIR is set, though our values are in process
            warnings.simplefilter("ignore", UserWarning)
            self.reference.clear()
        self.reference.labels(reference_id).set(1)
        published, counted = set(), set()
        for version, features in skews.items():
            for skew in features:
                self.rows.labels(skew.feature, version).set(skew.rows)
                counted.add((skew.feature, version))
                if skew.rows < min_rows:
                    continue
                published.add((skew.feature, version))
                for gauge, value in ((self.psi, skew.psi), (self.js, skew.js_divergence), (self.linf, skew.linf)):
                    if value is not None:
                        gauge.labels(skew.feature, version).set(value)
                self.defaulted.labels(skew.feature, version).set(skew.defaulted_rate)
                self.missing.labels(skew.feature, version).set(skew.missing_rate)
        # A version that left the window (retired) or fell under the minimum leaves no stale series behind.
        for gauges, gone in (
            ((self.psi, self.js, self.linf, self.defaulted, self.missing), self._published - published),
            ((self.rows,), self._counted - counted),
        ):
            for labels in gone:
                for gauge in gauges:
                    with contextlib.suppress(KeyError):  # a series never published for that version
                        gauge.remove(*labels)
        self._published, self._counted = published, counted
        for feature, limits in thresholds.items():
            for measure in ("psi_warn", "psi_alert", "js_alert", "linf_alert"):
                self.threshold.labels(feature, measure).set(getattr(limits, measure))
        self.last_check.set(time.time())

    def publish_consistency(self, report: Mapping[str, FeatureConsistency]) -> None:
        """Set each replayed feature's ratios from the last replay and count its comparisons."""
        for name, consistency in report.items():
            if not consistency.compared:
                continue
            self.mismatch.labels(name).set(consistency.mismatch_ratio)
            self.lag.labels(name).set(consistency.rate("lag"))
            self.ahead.labels(name).set(consistency.rate("ahead"))
            self.consistency_missing.labels(name).set(consistency.rate("missing"))
            self.extra.labels(name).set(consistency.rate("extra"))
            if consistency.smape is not None:
                self.smape.labels(name).set(consistency.smape)
            for outcome in OUTCOMES:
                self.comparisons.labels(name, outcome).inc(consistency.counts[outcome])
        self.last_replay.set(time.time())
