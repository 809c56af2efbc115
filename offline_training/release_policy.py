"""When a canary is promoted or rolled back: a declared policy over what the canary and prod showed meanwhile.

The release controller gathers, for each arm (canary, prod) over the canary's time so far: requests
and errors (the scorers' ``loopline_scoring_model_requests_total``), the 99th-percentile latency
(``loopline_scoring_model_latency_seconds``) and the quality of its scores on the events labeled
since (the label kind's headline, ``offline_training/evaluation.Quality``: AUC for a binary label,
RMSE for a numeric one). ``decide`` turns that into one of three verdicts, with the reason:

* roll back at once when, over at least the minimum requests, the canary's error rate exceeds prod's
  by more than the allowance or (both arms past the minimum) its p99 exceeds prod's by more than the
  ratio; or when, once both arms have enough labels, its quality falls short of prod's by more than the
  allowance (AUC points, or a relative RMSE increase);
* promote once the canary has been watched for the minimum time and served enough requests, and
  its quality held (or, when the policy does not require labels, none have come yet);
* otherwise keep watching, up to the longest watch, after which a canary without the required
  evidence is rolled back: no evidence is not good evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from offline_training.evaluation import Quality


@dataclass(frozen=True)
class ReleasePolicy:
    """The thresholds a canary is held to."""

    min_watch_s: float = 60.0
    max_watch_s: float = 3_600.0
    min_requests: int = 200
    max_error_rate_increase: float = 0.01
    max_latency_ratio: float = 1.5
    min_labels: int = 50
    max_auc_drop: float = 0.02
    max_rmse_increase: float = 0.05
    require_quality: bool = False
    #: The label's kind: what quality is measured by.
    label_kind: Literal["binary", "numeric"] = "binary"

    @property
    def quality(self) -> Quality:
        return Quality(self.label_kind)

    @property
    def allowed_shortfall(self) -> float:
        return self.quality.allowance(self.max_auc_drop, self.max_rmse_increase)


@dataclass(frozen=True)
class ArmStats:
    """What one arm (a model version under an alias) showed since the canary started."""

    version: str
    requests: int
    errors: int
    p99_s: float | None
    labeled: int
    #: The label kind's headline (AUC, RMSE) of its scores on the labeled events; None or NaN when not measured.
    quality: float | None

    @property
    def error_rate(self) -> float:
        """Errors per request (0 before any request)."""
        return self.errors / self.requests if self.requests else 0.0

    def quality_known(self, min_labels: int) -> bool:
        """Whether at least ``min_labels`` labeled events gave a quality (an AUC needs both classes among them)."""
        return self.labeled >= min_labels and self.quality is not None and self.quality == self.quality


@dataclass(frozen=True)
class Decision:
    """A verdict and why."""

    action: Literal["promote", "rollback", "wait"]
    reason: str


def decide(policy: ReleasePolicy, canary: ArmStats, prod: ArmStats, watched_s: float) -> Decision:
    """The policy's verdict on ``canary`` against ``prod`` after ``watched_s`` seconds."""
    if canary.requests >= policy.min_requests and canary.error_rate > prod.error_rate + policy.max_error_rate_increase:
        return Decision(
            "rollback",
            f"canary error rate {canary.error_rate:.2%} against prod {prod.error_rate:.2%} "
            f"(allowed +{policy.max_error_rate_increase:.2%})",
        )
    # A p99 over a handful of requests is their slowest one (a cold cache, a GC pause): judge latency
    # only when both arms have served the requests the policy asks for.
    latency_known = min(canary.requests, prod.requests) >= policy.min_requests and canary.p99_s is not None and prod.p99_s
    if latency_known and canary.p99_s > prod.p99_s * policy.max_latency_ratio:
        return Decision(
            "rollback",
            f"canary p99 {canary.p99_s * 1000:.1f} ms against prod {prod.p99_s * 1000:.1f} ms "
            f"(allowed ×{policy.max_latency_ratio})",
        )
    measure = policy.quality
    quality_known = canary.quality_known(policy.min_labels) and prod.quality_known(policy.min_labels)
    if quality_known and measure.shortfall(canary.quality, prod.quality) > policy.allowed_shortfall:
        return Decision(
            "rollback",
            f"canary {measure.describe(canary.quality)} against prod {measure.describe(prod.quality)} on "
            f"labeled events (allowed {measure.describe_allowance(policy.allowed_shortfall)} worse)",
        )
    evidence = canary.requests >= policy.min_requests and (quality_known or not policy.require_quality)
    if watched_s >= policy.min_watch_s and evidence:
        quality = (
            f", {measure.describe(canary.quality)} vs {measure.describe(prod.quality)}" if quality_known else ", no labels yet"
        )
        return Decision(
            "promote", f"{canary.requests} requests, error rate {canary.error_rate:.2%} vs {prod.error_rate:.2%}{quality}"
        )
    if watched_s >= policy.max_watch_s:
        return Decision(
            "rollback",
            f"not enough evidence after {watched_s:.0f} s ({canary.requests} requests, {canary.labeled} labeled events)",
        )
    return Decision("wait", f"watching ({watched_s:.0f} s, {canary.requests} requests, {canary.labeled} labeled events)")
