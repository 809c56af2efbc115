"""What a group of inputs is worth: one training config on one set of snapshot rows, once per set of inputs.

Each arm becomes a snapshot of its own that holds the same rows and only that arm's input columns, and is
trained for real by :func:`offline_training.launch.launch_training` (DeepSpeed under torchrun). The trainer
holds out the latest labelled rows by prediction time, so arms with the same rows share the time split;
with the same config they also share the seed, the data order and the hyper-parameters: only the inputs
differ, and the difference of their holdout metrics is what those inputs are worth.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from feedback_loop.snapshots import BASE_COLUMNS, write_snapshot
from offline_training.launch import launch_training


@dataclass(frozen=True)
class ArmResult:
    """One arm's run: its inputs, the snapshot it trained on, and the run's ``metrics.json``."""

    inputs: list[str]
    snapshot_id: str
    metrics: dict[str, Any]

    def holdout(self, metric: str) -> float:
        """The run's holdout ``metric`` (``auc``, ``rmse``, ...)."""
        return float(self.metrics["holdout"][metric])


def train_arms(
    frame: pd.DataFrame,
    arms: Mapping[str, Sequence[str]],
    root: Path,
    config: Path,
    processes: int = 2,
    echo: TextIO | None = None,
    label_kind: str = "binary",
) -> dict[str, ArmResult]:
    """Train ``config`` on the rows of ``frame`` (snapshot columns, labels of ``label_kind``) once per arm (name → its
    inputs), one after the other; each arm's snapshot goes under ``root/snapshots``, its run into ``root/runs/<arm>``
    (replaced)."""
    missing = sorted({name for inputs in arms.values() for name in inputs} - set(frame.columns))
    if missing:
        raise ValueError(f"the rows have no column for the inputs {missing}: backfill or log them first")
    root = Path(root)
    results = {}
    for arm, inputs in arms.items():
        manifest = write_snapshot(
            frame[[*BASE_COLUMNS, *inputs]],
            str(root / "snapshots"),
            kind="ablation",
            source={"ablation": arm},
            time_range={"from_ms": None, "to_ms": None},
            label_kind=label_kind,
        )
        out = root / "runs" / arm
        shutil.rmtree(out, ignore_errors=True)
        launch_training(root / "snapshots" / manifest.snapshot_id, config, out, processes, echo=echo)
        results[arm] = ArmResult(list(inputs), manifest.snapshot_id, json.loads((out / "metrics.json").read_text()))
    return results
