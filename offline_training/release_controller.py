"""The release controller (`loopline release watch`): watches the canary against prod and applies the policy.

Each look gathers, since the canary started: per arm, requests, errors and the latency histogram from
every scorer's ``/metrics`` (summed over scorers), and the quality of its scores on the events labeled since
(``training.examples``; AUC for a binary label, RMSE for a numeric one). ``offline_training/release_policy.py`` decides;
a promotion or a rollback is applied to the model registry, recorded with the controller as the actor and the policy's
reason.

Like for like: a scorer restarts both arms' per-version counts when it starts a canary
(``ScorerMetrics.start_comparison``), so on every scorer canary and prod are counted over the same
window, and the labeled events of both arms are those predicted since the canary started. The
controller keeps no baseline of its own: a restarted controller, or ``loopline release watch --once``
run from cron, sees the same evidence as one that has watched from the start.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import requests
from prometheus_client.parser import text_string_to_metric_families

from offline_training.evaluation import Quality
from offline_training.release import ModelRelease
from offline_training.release_policy import ArmStats, Decision, ReleasePolicy, decide
from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS
from schemas.records import TrainingExample

ACTOR = "release-controller"
_REQUESTS = "loopline_scoring_model_requests_total"
_LATENCY = "loopline_scoring_model_latency_seconds_bucket"


@dataclass
class _Counts:
    """One arm's counters as scraped: requests, errors, and cumulative latency bucket counts by upper bound."""

    ok: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)

    def p99_s(self) -> float | None:
        """The 99th percentile, interpolated within its bucket as Prometheus' ``histogram_quantile`` does (so it reads
        as a dashboard does, and moves with the data rather than by whole buckets)."""
        bounds = sorted(self.buckets.items())
        total = bounds[-1][1] if bounds else 0.0  # the +Inf bucket counts every observation
        if total <= 0:
            return None
        rank, lower, below = 0.99 * total, 0.0, 0.0
        for le, count in bounds:
            if count >= rank:
                if math.isinf(le):
                    return lower  # beyond the largest finite bound: that bound, as histogram_quantile answers
                return lower + (le - lower) * (rank - below) / (count - below)
            lower, below = le, count
        return None


def scrape(urls: Sequence[str], arms: Mapping[str, str]) -> dict[str, _Counts]:
    """The counters of each arm (``arms``: alias → version) summed over the scorers at ``urls``, both arms from the
    same scrape of each scorer (a scorer that does not answer adds nothing)."""
    counts = {alias: _Counts() for alias in arms}
    for url in urls:
        try:
            text = requests.get(url, timeout=5).text
        except requests.RequestException:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                arm = counts.get(labels.get("alias", ""))
                if arm is None or labels.get("version") != arms[labels["alias"]]:
                    continue
                if sample.name == _REQUESTS:
                    if labels.get("outcome") == "ok":
                        arm.ok += sample.value
                    else:
                        arm.errors += sample.value
                elif sample.name == _LATENCY:
                    le = float(labels["le"])
                    arm.buckets[le] = arm.buckets.get(le, 0.0) + sample.value
    return counts


def labeled_quality(examples: Sequence[TrainingExample], name: str, version: str, quality: Quality) -> tuple[int, float | None]:
    """(labeled events, ``quality``'s headline of the scores) of the examples model ``name`` v``version`` scored (one
    topic may carry the examples of several models, whose version numbers overlap)."""
    mine = [e for e in examples if e.model_name == name and e.model_version == version and e.label is not None]
    if not mine:
        return 0, None
    metrics = quality.metrics(np.array([e.score for e in mine]), np.array([float(e.label) for e in mine]))
    return len(mine), metrics[quality.headline]


class ReleaseController:
    """Watches ``name``'s canary with ``policy``; ``examples(since_ms)`` gives the labeled feedback since a time."""

    def __init__(
        self,
        release: ModelRelease,
        name: str,
        policy: ReleasePolicy,
        metrics_urls: Sequence[str],
        examples: Callable[[int], Sequence[TrainingExample]],
    ) -> None:
        self.release, self.name, self.policy = release, name, policy
        self.metrics_urls, self.examples = list(metrics_urls), examples

    def observe(self) -> tuple[ArmStats, ArmStats, float] | None:
        """(canary, prod, seconds watched) now; None when no canary is out."""
        aliases = self.release.aliases(self.name)
        canary, prod = aliases.get(CANARY_ALIAS), aliases.get(PROD_ALIAS)
        if canary is None or prod is None:
            return None
        started = max(
            (c.at_ms for c in self.release.history(self.name) if c.alias == CANARY_ALIAS and c.version == canary),
            default=int(time.time() * 1000),
        )
        feedback = self.examples(started)
        scraped = scrape(self.metrics_urls, {CANARY_ALIAS: canary, PROD_ALIAS: prod})
        arms = []
        for alias, version in ((CANARY_ALIAS, canary), (PROD_ALIAS, prod)):
            counts = scraped[alias]
            labeled, quality = labeled_quality(feedback, self.name, version, self.policy.quality)
            requests_ = int(counts.ok + counts.errors)
            arms.append(ArmStats(version, requests_, int(counts.errors), counts.p99_s(), labeled, quality))
        return arms[0], arms[1], time.time() - started / 1000

    def step(self) -> tuple[Decision, ArmStats, ArmStats] | None:
        """Look once and apply the verdict; None when no canary is out."""
        observed = self.observe()
        if observed is None:
            return None
        canary, prod, watched_s = observed
        decision = decide(self.policy, canary, prod, watched_s)
        if decision.action == "promote":
            self.release.promote(self.name, canary.version, ACTOR, decision.reason)
        elif decision.action == "rollback":
            self.release.end_canary(self.name, ACTOR, decision.reason)
        return decision, canary, prod
