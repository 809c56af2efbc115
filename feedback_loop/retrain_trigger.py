"""When to retrain: prod's quality on the outcomes that came back over a recent window fell below a threshold (a
binary label: its AUC below ``min_auc``, or its calibration error above ``max_calibration_error``; a numeric label:
its RMSE above ``max_rmse``), or a skew or consistency alert is firing for it.

``decide`` is pure: it takes the labeled examples (``training.examples``), what the model registry says
(prod's and any canary's version, when the trigger last fired) and the time, and says whether to
fire and why. Only prod's own examples count (its model name and version), scored within the window
and labeled; at least
``min_labels`` of them (for a binary label, with both outcomes) before quality is judged at all. It stays quiet while a
canary is out (the release decides first) and for ``cooldown_s`` after it fired, which covers the
retraining it started: snapshot, training and evaluation take minutes.

Alerts are Prometheus' (the monitor's skew and consistency rules, ``infra/prometheus/``), read by the caller: an
alert fires the trigger when it names prod's version, or no version at all (consistency is per feature). A firing
says its causes (quality, alert or both); the caller acts on the strongest of their modes.

Quality is measured by a function passed in (``offline_training.evaluation.Quality.metrics`` in Loopline: the same
metrics training reports, by the label's kind), since this package sits below ``offline_training`` and does not import
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from schemas.records import TrainingExample

#: Scores and labels → named metrics: at least ``auc`` and ``calibration_error`` for a binary label (1.0 and 0.0),
#: ``rmse`` for a numeric one.
QualityFunction = Callable[[np.ndarray, np.ndarray], Mapping[str, float]]


@dataclass(frozen=True)
class TriggerPolicy:
    """The thresholds prod's labeled quality is held to, by the label's kind; ``max_calibration_error`` and
    ``max_rmse`` None: not judged."""

    window_s: float = 86_400.0
    min_auc: float = 0.75
    min_labels: int = 200
    cooldown_s: float = 21_600.0
    max_calibration_error: float | None = None
    max_rmse: float | None = None
    label_kind: Literal["binary", "numeric"] = "binary"


@dataclass(frozen=True)
class FiringAlert:
    """A Prometheus alert firing now: its rule's name, its labels (``feature``, ``model_version`` where the series has
    them) and since when (as Prometheus gives it)."""

    name: str
    labels: Mapping[str, str]
    active_at: str = ""

    def concerns(self, version: str) -> bool:
        """Whether it is about ``version``: it names that version, or none."""
        return self.labels.get("model_version", version) == version

    def describe(self) -> str:
        """``<name> firing for <feature> since <time>``, as far as the labels tell."""
        feature = self.labels.get("feature")
        return (
            f"{self.name} firing"
            + (f" for {feature}" if feature else "")
            + (f" since {self.active_at}" if self.active_at else "")
        )


@dataclass(frozen=True)
class TriggerDecision:
    """Whether to retrain, why, what made it fire (``causes``: prod's labeled quality, a firing alert, or both) and
    what was measured (``labeled`` examples; ``quality`` empty when not judged)."""

    fire: bool
    reason: str
    labeled: int = 0
    quality: Mapping[str, float] = field(default_factory=dict)
    causes: frozenset[Literal["quality", "alert"]] = frozenset()


def window_examples(
    examples: Iterable[TrainingExample], model_name: str, version: str, since_ms: int
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, labels) of the labeled examples ``model_name`` ``version`` scored at or after ``since_ms``."""
    mine = [
        e
        for e in examples
        if (e.model_name, e.model_version) == (model_name, version) and e.label is not None and e.predicted_at_ms >= since_ms
    ]
    return np.array([e.score for e in mine], dtype=np.float64), np.array([float(e.label) for e in mine], dtype=np.float64)


def decide(
    policy: TriggerPolicy,
    examples: Iterable[TrainingExample],
    *,
    model_name: str,
    prod_version: str | None,
    canary_version: str | None,
    now_ms: int,
    last_fired_ms: int | None,
    quality: QualityFunction | None,
    alerts: Sequence[FiringAlert] | None = None,
) -> TriggerDecision:
    """Whether the labeled quality of ``model_name``'s prod version over the window ending at ``now_ms``, or one of the
    firing ``alerts``, calls for retraining (``canary_version``: the canary out now, if any; ``last_fired_ms``: when
    this trigger last fired; ``quality`` None: quality is not judged; ``alerts`` None: alerts were not looked at)."""
    if prod_version is None:
        return TriggerDecision(False, "no prod model: nothing to judge")
    if canary_version is not None:
        return TriggerDecision(False, f"canary v{canary_version} is out: its release is decided first")
    if last_fired_ms is not None and now_ms - last_fired_ms < policy.cooldown_s * 1000:
        wait_s = (last_fired_ms + policy.cooldown_s * 1000 - now_ms) / 1000
        since_s = (now_ms - last_fired_ms) / 1000
        return TriggerDecision(False, f"cooling down: fired {since_s:,.0f} s ago, quiet for {wait_s:,.0f} s more")
    judged = (
        TriggerDecision(False, "quality is not judged")
        if quality is None
        else _judge_quality(policy, examples, model_name, prod_version, now_ms, quality)
    )
    concerning = [alert for alert in alerts or () if alert.concerns(prod_version)]
    named = "; ".join(alert.describe() for alert in concerning)
    if judged.fire:
        return replace(
            judged,
            reason=judged.reason + (f"; also {named}" if named else ""),
            causes=frozenset({"quality", "alert"} if concerning else {"quality"}),
        )
    if concerning:
        return replace(judged, fire=True, reason=f"{named} (prod v{prod_version}); {judged.reason}", causes=frozenset({"alert"}))
    if alerts is None:
        return judged
    ignored = f" ({len(alerts)} firing for other versions)" if alerts else ""
    return replace(judged, reason=f"{judged.reason}; no alert firing for prod v{prod_version}{ignored}")


def _judge_quality(
    policy: TriggerPolicy,
    examples: Iterable[TrainingExample],
    model_name: str,
    prod_version: str,
    now_ms: int,
    quality: QualityFunction,
) -> TriggerDecision:
    """Prod's labeled quality over the window against the policy."""
    scores, labels = window_examples(examples, model_name, prod_version, now_ms - int(policy.window_s * 1000))
    where = f"prod v{prod_version} over {len(labels):,} labeled examples of the last {policy.window_s:,.0f} s"
    if len(labels) < policy.min_labels:
        return TriggerDecision(False, f"{where}: quality is judged from {policy.min_labels:,}", len(labels))
    measured = dict(quality(scores, labels))
    if policy.label_kind == "numeric":
        rmse = measured["rmse"]
        if policy.max_rmse is not None and rmse > policy.max_rmse:
            return TriggerDecision(True, f"{where}: RMSE {rmse:.4g} above {policy.max_rmse:g}", len(labels), measured)
        return TriggerDecision(False, f"{where}: RMSE {rmse:.4g}: within the policy", len(labels), measured)
    auc = measured["auc"]
    if math.isnan(auc):
        return TriggerDecision(False, f"{where}: one outcome only, no AUC yet", len(labels), measured)
    if auc < policy.min_auc:
        return TriggerDecision(True, f"{where}: AUC {auc:.3f} below {policy.min_auc:g}", len(labels), measured)
    calibration = measured["calibration_error"]
    if policy.max_calibration_error is not None and calibration > policy.max_calibration_error:
        return TriggerDecision(
            True, f"{where}: calibration error {calibration:.3f} above {policy.max_calibration_error:g}", len(labels), measured
        )
    return TriggerDecision(
        False, f"{where}: AUC {auc:.3f}, calibration error {calibration:.3f}: within the policy", len(labels), measured
    )
