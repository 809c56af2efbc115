"""A trained candidate's known defects: measured problems, each stated with the figure that shows it and the bound it
crossed, for its model card and its registry version.

The checks look at what the card's numbers rest on: how the model to be registered scores the holdout (for a binary
label: calibration, recall at the operating threshold), how much the holdout can tell (rows of each class, or rows),
what the training rows held (inputs mostly defaulted or missing, inputs constant), INT8's measured latency, and prod
(not comparable, or scoring the same rows better by the label's headline metric). A check that finds nothing adds
nothing; a card without defects names the checks that ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from offline_training.evaluation import Quality

if TYPE_CHECKING:
    from offline_training.candidate import Comparison
    from offline_training.quantization import QuantizationResult
    from offline_training.training_data import Snapshot


@dataclass(frozen=True)
class DefectBounds:
    """Where a figure becomes a known defect."""

    max_calibration_error: float = 0.05
    min_recall: float = 0.5
    #: Below this many rows of either class in the holdout, its figures are noise.
    min_holdout_class_rows: int = 50
    max_defaulted_share: float = 0.5
    max_missing_share: float = 0.5

    def checks(self) -> list[str]:
        """What the checks look for, with these bounds (what a card without defects was checked for)."""
        return [
            f"holdout calibration error above {self.max_calibration_error:g} (binary labels)",
            f"recall at the operating threshold below {self.min_recall:g} (binary labels)",
            f"fewer than {self.min_holdout_class_rows} holdout rows of a class (binary labels) or in all (numeric)",
            f"more than {self.max_defaulted_share:.0%} of training rows scored with a defaulted input",
            f"an input missing in more than {self.max_missing_share:.0%} of training rows",
            "an input constant in training",
            "a kept INT8 model slower than fp32",
            "prod not comparable, or scoring the holdout better",
        ]


@dataclass(frozen=True)
class KnownDefect:
    """One measured problem: which check found it, the statement (with its figure) and the figures themselves."""

    check: str
    statement: str
    figures: dict[str, float | int | str]


def known_defects(
    snapshot: Snapshot,
    comparison: Comparison,
    metrics: dict[str, float],
    quantization: QuantizationResult | None,
    bounds: DefectBounds = DefectBounds(),
) -> list[KnownDefect]:
    """The defects of the model whose holdout ``metrics`` these are (the INT8 one when it was kept), trained on
    ``snapshot``'s training rows and compared with prod in ``comparison``."""
    return [
        *_holdout_defects(comparison, metrics, bounds),
        *_training_defects(snapshot, bounds),
        *_int8_defects(quantization),
        *_prod_defects(comparison, metrics),
    ]


def _holdout_defects(comparison: Comparison, metrics: dict[str, float], bounds: DefectBounds) -> list[KnownDefect]:
    if comparison.label_kind == "numeric":
        rows = comparison.holdout_rows
        if rows >= bounds.min_holdout_class_rows:
            return []
        return [
            KnownDefect(
                "small_holdout",
                f"the holdout holds {rows:,} rows, fewer than {bounds.min_holdout_class_rows}: its RMSE and MAE are noisy",
                {"rows": rows, "bound": bounds.min_holdout_class_rows},
            )
        ]
    defects = []
    positives, negatives = comparison.holdout_positives, comparison.holdout_rows - comparison.holdout_positives
    calibration, recall = metrics["calibration_error"], metrics["recall"]
    if calibration > bounds.max_calibration_error:
        defects.append(
            KnownDefect(
                "calibration_error",
                f"holdout calibration error {calibration:.3f}, above {bounds.max_calibration_error:g}: its scores are off the "
                f"observed positive rates by {calibration:.1%} on average, so a score is not a probability to act on as it is",
                {"calibration_error": calibration, "bound": bounds.max_calibration_error},
            )
        )
    if recall < bounds.min_recall:  # NaN (a holdout without positives) compares False: the small holdout is the defect then
        caught = round(recall * positives)
        defects.append(
            KnownDefect(
                "recall_at_threshold",
                f"recall {recall:.3f} at the operating threshold {comparison.threshold:g}, below {bounds.min_recall:g}: it "
                f"flags {caught:,} of the holdout's {positives:,} positives",
                {
                    "recall": recall,
                    "threshold": comparison.threshold,
                    "flagged_positives": caught,
                    "positives": positives,
                    "bound": bounds.min_recall,
                },
            )
        )
    if min(positives, negatives) < bounds.min_holdout_class_rows:
        defects.append(
            KnownDefect(
                "small_holdout",
                f"the holdout holds {positives:,} positive and {negatives:,} negative rows, fewer than "
                f"{bounds.min_holdout_class_rows} of a class: its AUC, recall and calibration are noisy",
                {"positives": positives, "negatives": negatives, "bound": bounds.min_holdout_class_rows},
            )
        )
    return defects


def _training_defects(snapshot: Snapshot, bounds: DefectBounds) -> list[KnownDefect]:
    defects = []
    rows = len(snapshot.train_y)
    if snapshot.train_defaulted is not None:
        defaulted = int(np.count_nonzero(snapshot.train_defaulted))
        if defaulted / rows > bounds.max_defaulted_share:
            mean = float(snapshot.train_defaulted.mean())
            defects.append(
                KnownDefect(
                    "defaulted_inputs",
                    f"{defaulted:,} of {rows:,} training rows ({defaulted / rows:.0%}) were scored with inputs defaulted "
                    f"(on average {mean:.2f} of {len(snapshot.inputs)}), more than {bounds.max_defaulted_share:.0%}: the "
                    "model learned from declared defaults, not the entities' values",
                    {
                        "rows_defaulted": defaulted,
                        "rows": rows,
                        "mean_inputs_defaulted": mean,
                        "bound": bounds.max_defaulted_share,
                    },
                )
            )
    for spec in snapshot.inputs:
        name, column = spec.name, snapshot.train[spec.name]
        present = column[column.notna() & (column != "")].to_numpy()
        missing = rows - len(present)
        if missing / rows > bounds.max_missing_share:
            defects.append(
                KnownDefect(
                    "missing_input",
                    f"{name} is missing in {missing:,} of {rows:,} training rows ({missing / rows:.0%}), more than "
                    f"{bounds.max_missing_share:.0%}: the model reads a missing value as the training mean",
                    {"input": name, "rows_missing": missing, "rows": rows, "bound": bounds.max_missing_share},
                )
            )
        if len(present) and np.all(present == present[0]):
            value = present[0] if spec.kind == "text" else float(present[0])
            defects.append(
                KnownDefect(
                    "constant_input",
                    f"{name} is {value!r:.40} in all {len(present):,} training rows that have it: the model cannot have "
                    "learned from it, and any other value it meets online is one it never trained on",
                    {"input": name, "value": value, "rows": len(present)},
                )
            )
    return defects


def _int8_defects(quantization: QuantizationResult | None) -> list[KnownDefect]:
    if quantization is None or not quantization.kept or quantization.latency_gain >= 1:
        return []
    fp32, int8 = quantization.fp32_latency.median_ms, quantization.int8_latency.median_ms
    return [
        KnownDefect(
            "int8_slower",
            f"the INT8 model kept for registration is slower than fp32 on this machine: median {int8:.3f} ms against "
            f"{fp32:.3f} ms per batch of {quantization.batch_size} (×{quantization.latency_gain:.2f})",
            {"int8_median_ms": int8, "fp32_median_ms": fp32, "batch_size": quantization.batch_size},
        )
    ]


def _prod_defects(comparison: Comparison, metrics: dict[str, float]) -> list[KnownDefect]:
    version = comparison.prod_version
    if version is None:
        return []
    if comparison.not_comparable:
        return [
            KnownDefect(
                "not_comparable",
                f"not compared with prod v{version} on the holdout: {comparison.not_comparable}",
                {"prod_version": version, "reason": comparison.not_comparable},
            )
        ]
    quality = Quality(comparison.label_kind)
    ours, prods = metrics[quality.headline], comparison.prod[quality.headline]
    if math.isnan(ours) or math.isnan(prods) or quality.shortfall(ours, prods) <= 0:
        return []
    return [
        KnownDefect(
            "worse_than_prod",
            f"holdout {quality.describe(ours)}, worse than prod v{version}'s {quality.describe(prods)} on the same "
            f"{comparison.holdout_rows:,} rows",
            {quality.headline: ours, f"prod_{quality.headline}": prods, "prod_version": version},
        )
    ]
