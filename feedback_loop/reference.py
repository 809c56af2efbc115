"""A feature's reference distribution in a training snapshot, computed once when the snapshot is written: fixed bins
for numbers (the snapshot's own deciles), value shares for categories, the missing rate and moments. The skew
monitor and `snapshot diff` compare later values against it (``feedback_loop/drift.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from schemas.model_contract import REQUEST_PREFIX

#: Reference histograms use this many bins (deciles of the snapshot's own values).
REFERENCE_BINS = 10


@dataclass(frozen=True)
class FeatureReference:
    """A feature's distribution in a snapshot, for drift checks against it: bin edges fixed here (deciles),
    the share of values per bin (values below the first edge count in the first bin, above the last in the
    last), the missing rate and moments. Categorical features (strings) keep value shares instead."""

    kind: str
    missing_rate: float
    edges: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    mean: float | None = None
    std: float | None = None
    minimum: float | None = None
    maximum: float | None = None


def is_categorical(column: pd.Series) -> bool:
    """Whether a feature column holds categories: any present value a string (numbers and booleans are numeric)."""
    return any(isinstance(value, str) for value in column.dropna())


def overran_reads(defaulted: pd.Series | np.ndarray, inputs: Sequence[str]) -> np.ndarray:
    """Which rows had every stored input defaulted (``defaulted``: how many inputs each row defaulted): a feature read
    that overran its budget, or found no row for any of the entities. Such a row says nothing of the features'
    distribution, so skew is measured without it, on both sides; how often it happens is the default rate's own
    metric and alert (``LooplineFeaturesDefaulted``)."""
    stored = sum(1 for name in inputs if not name.startswith(REQUEST_PREFIX))
    return np.asarray(defaulted) >= stored if stored else np.zeros(len(defaulted), dtype=bool)


def reference_statistics(frame: pd.DataFrame, inputs: Sequence[str]) -> dict[str, FeatureReference]:
    """Each input's reference distribution in ``frame``: decile bins for numbers, value shares for categories; rows
    whose every stored input defaulted (its ``defaulted`` column, when it has one) are left out (``overran_reads``)."""
    if "defaulted" in frame:
        frame = frame[~overran_reads(frame["defaulted"], inputs)]
    references = {}
    for name in inputs:
        missing = float(frame[name].isna().mean()) if len(frame) else 0.0
        if is_categorical(frame[name]):
            shares = frame[name].dropna().astype(str).value_counts(normalize=True).sort_index()
            references[name] = FeatureReference("categorical", missing, values={k: float(v) for k, v in shares.items()})
            continue
        values = pd.to_numeric(frame[name], errors="coerce").dropna().to_numpy(dtype=float)
        if values.size == 0:
            references[name] = FeatureReference("numeric", missing)
            continue
        edges = np.unique(np.quantile(values, np.linspace(0, 1, REFERENCE_BINS + 1)[1:-1]))
        shares = bin_shares(values, edges)
        references[name] = FeatureReference(
            "numeric",
            missing,
            edges=[float(e) for e in edges],
            shares=shares,
            mean=float(values.mean()),
            std=float(values.std()),
            minimum=float(values.min()),
            maximum=float(values.max()),
        )
    return references


def bin_counts(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """How many ``values`` fall in each bin cut at ``edges`` (len(edges) + 1 bins; below and above go to the ends)."""
    return np.bincount(np.searchsorted(np.asarray(edges, dtype=float), values, side="right"), minlength=len(edges) + 1)


def bin_shares(values: np.ndarray, edges: Sequence[float]) -> list[float]:
    """The share of ``values`` in each bin cut at ``edges``."""
    if values.size == 0:
        return [0.0] * (len(edges) + 1)
    return [float(c) / values.size for c in bin_counts(values, edges)]
