"""How good a fraud model's scores are against outcomes: ranking (ROC AUC), calibration (Brier, log loss,
per-bin rates) and the operating point (precision and recall at the threshold an alert fires at).

Training's holdout, the comparison of a candidate with ``prod`` on the same rows and the release
controller's quality check all use these, so a number means the same wherever it is quoted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


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
