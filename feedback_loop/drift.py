"""Distribution skew: online feature values against a training snapshot's reference distribution.

Every measure works on counts (per reference bin for numbers, per value for categories), so a window of the
online feature log is kept as counts that add up, and a check never revisits rows:

* PSI (population stability index), Σ (a − e) · ln(a / e) over the reference's fixed bins, shares floored at
  ``SHARE_FLOOR`` so an empty bin does not make it infinite. The field's usual reading: < 0.1 stable,
  0.1–0.25 a shift worth a look, ≥ 0.25 a shift that matters.
* Jensen–Shannon divergence (base 2, so in [0, 1]) over the same bins, for numbers: symmetric and bounded,
  where PSI grows without limit as a bin empties.
* L∞, the largest difference of one value's share, for categories (a new value counts as 0 in the reference).
* The missing rate (no value) and the defaulted rate (the scorer fell back to the feature's default).

A logged value is counted the way the reference counted the snapshot's values (``reference.py``); what cannot be
counted so is named by ``value_problem``, and the window leaves its record out as a bad record of that reason:

* None and NaN are missing (NaN is what the scorer gives a model for a feature it has no value for).
* A boolean is the number 0 or 1 for a numeric reference, and ``"True"``/``"False"`` for a categorical one (the
  reference took booleans as numbers, and every value of a categorical column as its text).
* A finite number counts in its bin, however far outside the reference (a value beyond float32 lands in an end bin);
  for a categorical reference it is the category of its text.
* ±Infinity and integers beyond a double's range are ``not_finite``: no model takes them and no bin holds them.
* A string where the reference holds numbers is ``wrong_type`` (the scorer gave the model NaN for it, but logged the
  string: serving and training disagree on the feature's type), and so is anything not a number, string or boolean.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from feedback_loop.reference import FeatureReference, bin_counts

#: Shares below this count as this, so PSI stays finite when a bin is empty on one side.
SHARE_FLOOR = 1e-4
#: Why a logged value cannot be counted against its reference (``value_problem``).
NOT_FINITE, WRONG_TYPE = "not_finite", "wrong_type"


@dataclass(frozen=True)
class SkewThresholds:
    """When a feature's skew warns or alerts: the field's usual defaults (PSI 0.1 / 0.25, JS and L∞ 0.1)."""

    psi_warn: float = 0.1
    psi_alert: float = 0.25
    js_alert: float = 0.1
    linf_alert: float = 0.1


@dataclass(frozen=True)
class FeatureCounts:
    """A feature's online values over a window, as counts that add up: per reference bin (numbers) or per value
    (categories), and rows with no value, rows where the scorer used the default, all rows."""

    bins: tuple[int, ...] = ()
    categories: tuple[tuple[str, int], ...] = ()
    missing: int = 0
    defaulted: int = 0
    rows: int = 0

    def __add__(self, other: FeatureCounts) -> FeatureCounts:
        if not self.rows:
            return other
        if not other.rows:
            return self
        categories = dict(self.categories)
        for value, count in other.categories:
            categories[value] = categories.get(value, 0) + count
        bins = (
            tuple(a + b for a, b in zip(self.bins, other.bins, strict=True))
            if self.bins and other.bins
            else self.bins or other.bins
        )
        return FeatureCounts(
            bins,
            tuple(sorted(categories.items())),
            self.missing + other.missing,
            self.defaulted + other.defaulted,
            self.rows + other.rows,
        )


def value_problem(reference: FeatureReference, value: object) -> str | None:
    """Why ``value`` cannot be counted against ``reference`` (``NOT_FINITE``, ``WRONG_TYPE``), or None when it can
    (missing included): the rules of this module's docstring."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return None if reference.kind == "categorical" else WRONG_TYPE
    if isinstance(value, int):
        return None if abs(value) <= sys.float_info.max else NOT_FINITE
    if isinstance(value, float):
        return NOT_FINITE if math.isinf(value) else None
    return WRONG_TYPE


def count_values(reference: FeatureReference, values: np.ndarray | list, defaulted: np.ndarray | None = None) -> FeatureCounts:
    """Count one feature's online ``values`` (None or NaN: missing) against its reference; ``defaulted`` marks the rows
    where the scorer used the default. Every value must be one ``value_problem`` lets through."""
    rows = len(values)
    used = int(np.count_nonzero(defaulted)) if defaulted is not None else 0
    if reference.kind == "categorical":
        present = [str(v) for v in values if v is not None and v == v]
        names, counts = np.unique(np.asarray(present, dtype=object).astype(str), return_counts=True) if present else ((), ())
        return FeatureCounts((), tuple(zip(map(str, names), map(int, counts), strict=True)), rows - len(present), used, rows)
    numbers = np.asarray(values, dtype=float)
    present = numbers[~np.isnan(numbers)]
    return FeatureCounts(tuple(int(c) for c in bin_counts(present, reference.edges)), (), rows - present.size, used, rows)


def _shares(counts: np.ndarray) -> np.ndarray:
    total = counts.sum()
    return counts / total if total else np.zeros_like(counts, dtype=float)


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """PSI of the ``actual`` shares against the ``expected`` ones (same bins)."""
    e, a = np.maximum(expected, SHARE_FLOOR), np.maximum(actual, SHARE_FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


def js_divergence(expected: np.ndarray, actual: np.ndarray) -> float:
    """Jensen–Shannon divergence (base 2, in [0, 1]) of two share vectors over the same bins."""
    middle = (expected + actual) / 2

    def kl(p: np.ndarray) -> float:
        mask = p > 0
        with np.errstate(divide="ignore", over="ignore"):
            # p / middle <= 2 exactly; with subnormal shares the division can overflow, so the bound holds it.
            return float(np.sum(p[mask] * np.minimum(np.log2(p[mask] / middle[mask]), 1.0)))

    return max(0.0, (kl(expected) + kl(actual)) / 2)


@dataclass(frozen=True)
class FeatureSkew:
    """One feature's skew over a window against the reference: ``js_divergence`` for numbers, ``linf`` for
    categories (None where it does not apply, and every measure None without a value to compare)."""

    feature: str
    kind: str
    rows: int
    psi: float | None
    js_divergence: float | None
    linf: float | None
    missing_rate: float
    defaulted_rate: float

    def level(self, thresholds: SkewThresholds) -> str:
        """``alert``, ``warn`` or ``ok`` under ``thresholds``."""
        if (
            (self.psi or 0) >= thresholds.psi_alert
            or (self.js_divergence or 0) >= thresholds.js_alert
            or (self.linf or 0) >= thresholds.linf_alert
        ):
            return "alert"
        return "warn" if (self.psi or 0) >= thresholds.psi_warn else "ok"


def feature_skew(name: str, reference: FeatureReference, counts: FeatureCounts) -> FeatureSkew:
    """The skew of a window's ``counts`` of feature ``name`` against its ``reference``."""
    rows = max(counts.rows, 1)
    missing_rate, defaulted_rate = counts.missing / rows, counts.defaulted / rows
    if reference.kind == "categorical":
        seen = dict(counts.categories)
        values = sorted(set(reference.values) | set(seen))
        expected = np.array([reference.values.get(v, 0.0) for v in values])
        actual = _shares(np.array([seen.get(v, 0) for v in values], dtype=float))
        if not values or not actual.any():
            return FeatureSkew(name, reference.kind, counts.rows, None, None, None, missing_rate, defaulted_rate)
        return FeatureSkew(
            name,
            reference.kind,
            counts.rows,
            psi(expected, actual),
            None,
            float(np.max(np.abs(actual - expected))),
            missing_rate,
            defaulted_rate,
        )
    actual = _shares(np.asarray(counts.bins, dtype=float))
    if not reference.edges or not actual.any():
        return FeatureSkew(name, reference.kind, counts.rows, None, None, None, missing_rate, defaulted_rate)
    expected = np.asarray(reference.shares, dtype=float)
    return FeatureSkew(
        name,
        reference.kind,
        counts.rows,
        psi(expected, actual),
        js_divergence(expected, actual),
        None,
        missing_rate,
        defaulted_rate,
    )


def skew_check(
    references: Mapping[str, FeatureReference],
    columns: Mapping[str, np.ndarray | list],
    defaulted: Mapping[str, np.ndarray] | None = None,
) -> list[FeatureSkew]:
    """Every referenced feature's skew over the rows of ``columns`` (feature → values; ``defaulted``: feature → a
    boolean per row), in the references' order; a feature the rows do not carry is all missing."""
    skews = []
    rows = len(next(iter(columns.values()))) if columns else 0
    for name, reference in references.items():
        values = columns.get(name)
        values = np.full(rows, np.nan) if values is None else values
        skews.append(feature_skew(name, reference, count_values(reference, values, (defaulted or {}).get(name))))
    return skews
