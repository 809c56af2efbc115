"""A snapshot's labelled rows as training and evaluation read them: the time-based split into train and holdout.

Kept apart from ``train.py`` (which imports DeepSpeed) so evaluating a run does not pay for importing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset


@dataclass(frozen=True)
class Snapshot:
    """A snapshot's labelled rows, split on time: ``train`` before, ``holdout`` after. ``train_defaulted``: how many of
    each training row's inputs the scorer defaulted (so they hold the declared default, not the entity's value); None
    for files without the ``defaulted`` column (a snapshot not written by ``feedback_loop/snapshots.py``)."""

    snapshot_id: str
    inputs: list[str]
    train_x: np.ndarray
    train_y: np.ndarray
    holdout_x: np.ndarray
    holdout_y: np.ndarray
    train_defaulted: np.ndarray | None = None


def load_snapshot(path: Path, holdout_fraction: float) -> Snapshot:
    """The labelled rows of the snapshot folder ``path`` (``manifest.json`` + ``data/**/*.parquet``).

    Unlabelled rows are skipped; the latest ``holdout_fraction`` of the rest by ``predicted_at_ms``
    is the holdout. The inputs are ``manifest["features"]``, in that order.
    """
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text())
    inputs = list(manifest["features"])
    try:
        stored = pyarrow.dataset.dataset(path / "data", format="parquet", partitioning="hive").schema.names
        defaulted = ["defaulted"] if "defaulted" in stored else []
        frame = pd.read_parquet(path / "data", columns=["event_id", "label", "predicted_at_ms", *defaulted, *inputs])
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"snapshot {path}: cannot read event_id, label, predicted_at_ms and its {len(inputs)} features from "
            f"data/**/*.parquet ({err}); snapshots are written by feedback_loop/snapshots.py"
        ) from err
    categorical = [name for name, ref in manifest.get("reference", {}).items() if ref.get("kind") == "categorical" and name in inputs]
    if categorical:
        raise ValueError(f"snapshot {path}: the MLP trains on numbers, and {categorical} hold categories; "
                         "encode them as numbers in the feature view, or train without them")  # fmt: skip
    frame = frame[frame["label"].notna()].sort_values(["predicted_at_ms", "event_id"], kind="stable")
    holdout = int(round(len(frame) * holdout_fraction))
    if holdout < 1 or len(frame) - holdout < 1:
        raise ValueError(f"snapshot {path}: {len(frame)} labelled rows cannot make a training split and a holdout")
    x = frame[inputs].to_numpy(dtype=np.float64)
    y = frame["label"].to_numpy(dtype=np.float64)
    cut = len(frame) - holdout
    train_defaulted = frame["defaulted"].to_numpy(dtype=np.int64)[:cut] if defaulted else None
    return Snapshot(str(manifest["snapshot_id"]), inputs, x[:cut], y[:cut], x[cut:], y[cut:], train_defaulted)
