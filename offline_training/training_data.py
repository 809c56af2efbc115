"""A snapshot's labelled rows as training and evaluation read them: the time-based split into train and holdout.

Kept apart from ``train.py`` (which imports DeepSpeed) so evaluating a run does not pay for importing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import fsspec
import numpy as np
import pandas as pd
import pyarrow.dataset

from schemas.model_contract import ModelInput


@dataclass(frozen=True)
class Snapshot:
    """A snapshot's labelled rows, split on time: ``train`` before, ``holdout`` after, each a frame of the inputs'
    columns in order (numbers as floats, texts as strings or None). ``label_kind``: binary (labels 1.0 and 0.0) or
    numeric. ``train_defaulted``: how many of each training row's inputs the scorer defaulted (so they hold the
    declared default, not the entity's value); None for files without the ``defaulted`` column (a snapshot not written
    by ``feedback_loop/snapshots.py``)."""

    snapshot_id: str
    inputs: list[ModelInput]
    label_kind: Literal["binary", "numeric"]
    train: pd.DataFrame
    train_y: np.ndarray
    holdout: pd.DataFrame
    holdout_y: np.ndarray
    train_defaulted: np.ndarray | None = None
    #: The snapshot's ``manifest.json``.
    manifest: dict = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def train_x(self) -> np.ndarray:
        """The training rows' numeric inputs, ``[rows, numbers]`` float64 (NaN where missing)."""
        return numbers_of(self.train, self.inputs)

    @property
    def holdout_x(self) -> np.ndarray:
        """The holdout rows' numeric inputs, ``[rows, numbers]`` float64 (NaN where missing)."""
        return numbers_of(self.holdout, self.inputs)


def numbers_of(frame: pd.DataFrame, inputs: list[ModelInput]) -> np.ndarray:
    """The numeric ``inputs``' columns of ``frame``, in order, as float64 (NaN where missing)."""
    return frame[[spec.name for spec in inputs if spec.kind == "number"]].to_numpy(dtype=np.float64)


def texts_of(frame: pd.DataFrame, inputs: list[ModelInput]) -> np.ndarray:
    """The text ``inputs``' columns of ``frame``, in order, as strings (the empty string where missing, as the scorer
    feeds a missing text)."""
    columns = [spec.name for spec in inputs if spec.kind == "text"]
    values = frame[columns].astype(object).where(frame[columns].notna(), "")
    return values.to_numpy(dtype=object).reshape(len(frame), len(columns))


def load_snapshot(location: Path | str, holdout_fraction: float) -> Snapshot:
    """The labelled rows of the snapshot folder at ``location`` (``manifest.json`` + ``data/**/*.parquet``): a path or
    an fsspec URL (``s3://…``, ``gs://…``, ``file://…``: what ``feedback.snapshots`` may name), so every node of a run
    reads the same snapshot where it lies.

    Unlabelled rows are skipped; the latest ``holdout_fraction`` of the rest by ``predicted_at_ms``
    is the holdout. The inputs are ``manifest["features"]``, in that order; an input whose reference statistics are
    categorical is a text, any other a number.
    """
    path = str(location)
    fs, root = fsspec.core.url_to_fs(path)
    manifest = json.loads(fs.cat_file(f"{root}/manifest.json"))
    names = list(manifest["features"])
    reference = manifest.get("reference", {})
    inputs = [ModelInput(name, "text" if reference.get(name, {}).get("kind") == "categorical" else "number") for name in names]
    try:
        dataset = pyarrow.dataset.dataset(f"{root}/data", filesystem=fs, format="parquet", partitioning="hive")
        defaulted = ["defaulted"] if "defaulted" in dataset.schema.names else []
        frame = dataset.to_table(columns=["event_id", "label", "predicted_at_ms", *defaulted, *names]).to_pandas()
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"snapshot {path}: cannot read event_id, label, predicted_at_ms and its {len(names)} features from "
            f"data/**/*.parquet ({err}); snapshots are written by feedback_loop/snapshots.py"
        ) from err
    frame = frame[frame["label"].notna()].sort_values(["predicted_at_ms", "event_id"], kind="stable").reset_index(drop=True)
    holdout = int(round(len(frame) * holdout_fraction))
    if holdout < 1 or len(frame) - holdout < 1:
        raise ValueError(f"snapshot {path}: {len(frame)} labelled rows cannot make a training split and a holdout")
    for spec in inputs:
        if spec.kind == "number":
            frame[spec.name] = frame[spec.name].astype(np.float64)
    y = frame["label"].to_numpy(dtype=np.float64)
    cut = len(frame) - holdout
    train_defaulted = frame["defaulted"].to_numpy(dtype=np.int64)[:cut] if defaulted else None
    kind = manifest.get("label_kind", "binary")
    return Snapshot(
        str(manifest["snapshot_id"]),
        inputs,
        kind,
        frame[names].iloc[:cut].reset_index(drop=True),
        y[:cut],
        frame[names].iloc[cut:].reset_index(drop=True),
        y[cut:],
        train_defaulted,
        manifest,
    )
