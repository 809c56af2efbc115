"""A snapshot's labelled rows as training and evaluation read them: the time-based split into train and holdout.

Kept apart from ``train.py`` (which imports DeepSpeed) so evaluating a run does not pay for importing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np
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
    #: The snapshot's ``manifest.json``.
    manifest: dict = field(default_factory=dict)


def load_snapshot(location: Path | str, holdout_fraction: float) -> Snapshot:
    """The labelled rows of the snapshot folder at ``location`` (``manifest.json`` + ``data/**/*.parquet``): a path or
    an fsspec URL (``s3://…``, ``gs://…``, ``file://…``: what ``feedback.snapshots`` may name), so every node of a run
    reads the same snapshot where it lies.

    Unlabelled rows are skipped; the latest ``holdout_fraction`` of the rest by ``predicted_at_ms``
    is the holdout. The inputs are ``manifest["features"]``, in that order.
    """
    path = str(location)
    fs, root = fsspec.core.url_to_fs(path)
    manifest = json.loads(fs.cat_file(f"{root}/manifest.json"))
    inputs = list(manifest["features"])
    try:
        dataset = pyarrow.dataset.dataset(f"{root}/data", filesystem=fs, format="parquet", partitioning="hive")
        defaulted = ["defaulted"] if "defaulted" in dataset.schema.names else []
        frame = dataset.to_table(columns=["event_id", "label", "predicted_at_ms", *defaulted, *inputs]).to_pandas()
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
    return Snapshot(str(manifest["snapshot_id"]), inputs, x[:cut], y[:cut], x[cut:], y[cut:], train_defaulted, manifest)
