"""The release controller (`loopline release watch`): watches the canary against prod and applies the policy.

Each look gathers, since the canary started: per arm, requests, errors and the latency histogram from
every scorer's ``/metrics`` (summed over scorers; prod's counts as they grew since this controller's
first look at this canary), and the AUC of its scores on the events labeled since (``training.examples``).
``offline_training/release_policy.py`` decides; a promotion or a rollback is applied to the registry,
recorded with the controller as the actor and the policy's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import requests
from prometheus_client.parser import text_string_to_metric_families

from offline_training.evaluation import roc_auc
from offline_training.release import ModelRelease
from offline_training.release_policy import ArmStats, Decision, ReleasePolicy, decide
from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS
from schemas.records import TrainingExample

ACTOR = "release-controller"
_REQUESTS = "loopline_scoring_model_requests_total"
_LATENCY = "loopline_scoring_model_latency_seconds_bucket"


@dataclass
class _Counts:
    """One arm's cumulative counters as scraped: requests, errors, and latency bucket counts by upper bound."""

    ok: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] | None = None

    def minus(self, earlier: _Counts) -> _Counts:
        buckets = {le: n - (earlier.buckets or {}).get(le, 0.0) for le, n in (self.buckets or {}).items()}
        return _Counts(self.ok - earlier.ok, self.errors - earlier.errors, buckets)

    def p99_s(self) -> float | None:
        """The 99th percentile, as the upper bound of the histogram bucket it falls in."""
        if not self.buckets:
            return None
        total = max(self.buckets.values())
        if total <= 0:
            return None
        return next((le for le, n in sorted(self.buckets.items()) if n >= 0.99 * total), None)


def scrape(urls: Sequence[str], alias: str, version: str) -> _Counts:
    """``alias``/``version``'s counters summed over the scorers at ``urls`` (a scorer that does not answer adds nothing)."""
    counts = _Counts(buckets={})
    for url in urls:
        try:
            text = requests.get(url, timeout=5).text
        except requests.RequestException:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("alias") != alias or labels.get("version") != version:
                    continue
                if sample.name == _REQUESTS:
                    if labels.get("outcome") == "ok":
                        counts.ok += sample.value
                    else:
                        counts.errors += sample.value
                elif sample.name == _LATENCY:
                    le = float(labels["le"])
                    counts.buckets[le] = counts.buckets.get(le, 0.0) + sample.value
    return counts


def labeled_quality(examples: Sequence[TrainingExample], version: str) -> tuple[int, float | None]:
    """(labeled events, AUC of the scores) of ``version``'s examples."""
    mine = [e for e in examples if e.model_version == version and e.label is not None]
    if not mine:
        return 0, None
    return len(mine), roc_auc(np.array([e.score for e in mine]), np.array([float(e.label) for e in mine]))


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
        self._baseline: tuple[str, _Counts] | None = None

    def observe(self) -> tuple[ArmStats, ArmStats, float] | None:
        """(canary, prod, seconds watched) now; None when no canary is out."""
        aliases = self.release.aliases(self.name)
        canary, prod = aliases.get(CANARY_ALIAS), aliases.get(PROD_ALIAS)
        if canary is None or prod is None:
            return None
        started = max((c.at_ms for c in self.release.history(self.name) if c.alias == CANARY_ALIAS and c.version == canary),
                      default=int(time.time() * 1000))  # fmt: skip
        prod_counts = scrape(self.metrics_urls, PROD_ALIAS, prod)
        if self._baseline is None or self._baseline[0] != f"{canary}/{prod}":
            self._baseline = (f"{canary}/{prod}", prod_counts)
        prod_counts = prod_counts.minus(self._baseline[1])
        canary_counts = scrape(self.metrics_urls, CANARY_ALIAS, canary)
        feedback = self.examples(started)
        arms = []
        for version, counts in ((canary, canary_counts), (prod, prod_counts)):
            labeled, auc = labeled_quality(feedback, version)
            requests_ = int(counts.ok + counts.errors)
            arms.append(ArmStats(version, requests_, int(counts.errors), counts.p99_s(), labeled, auc))
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
