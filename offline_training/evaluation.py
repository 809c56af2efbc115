"""How good a model's scores are against outcomes, by the kind of its label.

* binary (a yes/no outcome): ranking (ROC AUC), calibration (Brier, log loss, per-bin rates) and the operating point
  (precision and recall at the threshold an alert fires at); the headline is the AUC, higher is better;
* numeric (a quantity): the errors (RMSE, MAE, the mean error's sign and size) and the share of variance
  explained (R²); the headline is the RMSE, lower is better.

Training's holdout, the comparison of a candidate with ``prod`` on the same rows, the release controller's quality
check and the retrain trigger all use these, so a number means the same wherever it is quoted; each judges by its
kind's :class:`Quality`, so no step speaks of AUC for a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

LabelKind = Literal["binary", "numeric"]


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by ranks (ties share their rank); NaN when the labels hold one class only."""
    positives = np.asarray(labels) == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = pd.Series(np.asarray(scores, dtype=np.float64)).rank(method="average").to_numpy()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def classification_metrics(scores: np.ndarray, labels: np.ndarray, threshold: float = 0.5, bins: int = 10) -> dict[str, float]:
    """AUC, log loss, Brier score, precision and recall at ``threshold``, and the expected calibration error
    (the mean |predicted − observed| rate over ``bins`` equal-width score bins, weighted by their rows)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    clipped = np.clip(scores, 1e-7, 1 - 1e-7)
    flagged = scores >= threshold
    true_positives = float(np.sum(flagged & (labels == 1)))
    which = np.minimum((scores * bins).astype(int), bins - 1)
    calibration = sum(
        abs(scores[which == b].mean() - labels[which == b].mean()) * np.sum(which == b) for b in range(bins) if np.any(which == b)
    ) / max(len(scores), 1)
    return {
        "auc": roc_auc(scores, labels),
        "log_loss": float(-np.mean(labels * np.log(clipped) + (1 - labels) * np.log(1 - clipped))),
        "brier": float(np.mean((scores - labels) ** 2)),
        "precision": true_positives / flagged.sum() if flagged.any() else float("nan"),
        "recall": true_positives / (labels == 1).sum() if (labels == 1).any() else float("nan"),
        "calibration_error": float(calibration),
    }


def regression_metrics(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """RMSE, MAE, the mean error (scores minus labels: its sign says over- or under-predicting) and R² (NaN for
    labels without spread)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    errors = scores - labels
    spread = float(np.sum((labels - labels.mean()) ** 2)) if len(labels) else 0.0
    return {
        "rmse": float(np.sqrt(np.mean(errors**2))) if len(errors) else float("nan"),
        "mae": float(np.mean(np.abs(errors))) if len(errors) else float("nan"),
        "mean_error": float(np.mean(errors)) if len(errors) else float("nan"),
        "r2": 1.0 - float(np.sum(errors**2)) / spread if spread > 0 else float("nan"),
    }


@dataclass(frozen=True)
class Quality:
    """How a label's kind is judged: its metrics, its headline metric (what a candidate is gated on, a canary judged
    by, the retrain trigger watches) and which way is better."""

    kind: LabelKind

    @property
    def headline(self) -> str:
        """``auc`` for a binary label, ``rmse`` for a numeric one."""
        return "auc" if self.kind == "binary" else "rmse"

    @property
    def higher_is_better(self) -> bool:
        return self.kind == "binary"

    def metrics(self, scores: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
        """Every metric of the kind for ``scores`` against ``labels``."""
        return classification_metrics(scores, labels, threshold) if self.kind == "binary" else regression_metrics(scores, labels)

    def measurable(self, value: float | None) -> bool:
        """Whether a headline value was measured (an AUC over one class, or no rows, is not)."""
        return value is not None and not math.isnan(value)

    def shortfall(self, value: float, baseline: float) -> float:
        """How much worse ``value`` is than ``baseline`` in the headline's own terms (negative: better): AUC points
        below it, or the RMSE's increase relative to it."""
        if self.kind == "binary":
            return baseline - value
        return (value - baseline) / baseline if baseline > 0 else (0.0 if value <= baseline else math.inf)

    def describe(self, value: float | None) -> str:
        """``AUC 0.812`` or ``RMSE 3.21`` (``—`` when not measured)."""
        shown = "—" if not self.measurable(value) else f"{value:.4g}" if self.kind == "numeric" else f"{value:.4f}"
        return f"{self.headline.upper()} {shown}"

    def allowance(self, max_auc_drop: float, max_rmse_increase: float) -> float:
        """The allowed shortfall of the kind: AUC points (binary), or a relative RMSE increase (numeric)."""
        return max_auc_drop if self.kind == "binary" else max_rmse_increase

    def describe_allowance(self, allowed: float) -> str:
        return f"{allowed:g} AUC" if self.kind == "binary" else f"{allowed:.0%} RMSE"
