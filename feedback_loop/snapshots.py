"""Versioned training snapshots: labeled examples as immutable, content-addressed parquet with a manifest.

A snapshot is a folder ``<root>/<snapshot id>/`` (a local path or any fsspec URL, e.g. ``s3://``):

* ``data/date=YYYY-MM-DD/part-0.parquet``: one row per example, partitioned by the UTC day it was
  scored: ``event_id``, ``request_id``, ``model_name``, ``model_version``, ``score``, ``label`` (a binary label
  1.0 or 0.0, a numeric one its value, empty for unlabeled), ``label_source``, ``predicted_at_ms``,
  ``label_time_ms``, ``defaulted`` (how many inputs fell back to defaults), then one column per model input,
  named as the model names it (``view:feature``, ``request:<field>``): the exact values the scorer used.
* ``manifest.json``: the snapshot id (a SHA-256 of the content, so the same examples always make the
  same id and different ones another), row count, time range, schema version, feature list, the label's kind
  (binary or numeric) and balance, model versions, where the examples came from (topic offsets, or a backfill), and reference
  statistics per feature (for the skew monitor: fixed bins, computed once here).

The manifest is written last: a folder without one is an unfinished write, never a snapshot.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
import pandas as pd

from feedback_loop.drift import count_values, feature_skew
from feedback_loop.reference import FeatureReference, is_categorical, reference_statistics
from schemas.records import TrainingExample

MANIFEST = "manifest.json"
#: Columns of every snapshot before the model inputs.
BASE_COLUMNS = (
    "event_id",
    "request_id",
    "model_name",
    "model_version",
    "score",
    "label",
    "label_source",
    "predicted_at_ms",
    "label_time_ms",
    "defaulted",
)


class SnapshotError(ValueError):
    """A snapshot that cannot be made or found; the message says what to do."""


@dataclass(frozen=True)
class Manifest:
    """What a snapshot holds (``manifest.json``)."""

    snapshot_id: str
    created_at_ms: int
    kind: str
    schema_version: int
    rows: int
    time_range: dict[str, int | None]
    features: list[str]
    label_balance: dict[str, int]
    model_versions: dict[str, int]
    source: dict[str, Any]
    reference: dict[str, FeatureReference]
    #: binary (labels 1.0 and 0.0) or numeric; snapshots from before labels had kinds are binary.
    label_kind: str = "binary"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        data["reference"] = {name: FeatureReference(**ref) for name, ref in data["reference"].items()}
        return cls(**data)


def examples_frame(examples: Iterable[TrainingExample], inputs: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per example (the columns of a snapshot); the inputs are ``inputs``, or every feature the examples carry
    in the order first seen."""
    examples = list(examples)
    if inputs is None:
        inputs = list(dict.fromkeys(name for example in examples for name in example.features))
    rows = []
    for e in examples:
        row = {
            "event_id": e.event_id,
            "request_id": e.request_id,
            "model_name": e.model_name,
            "model_version": e.model_version,
            "score": e.score,
            "label": None if e.label is None else float(e.label),
            "label_source": e.label_source,
            "predicted_at_ms": e.predicted_at_ms,
            "label_time_ms": e.label_time_ms,
            "defaulted": len(e.defaulted_features),
        }
        rows.append(row | {name: e.features.get(name) for name in inputs})
    return pd.DataFrame(rows, columns=[*BASE_COLUMNS, *inputs])


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame in one canonical form whatever the order of its rows: one example per event (the earliest scored),
    sorted by event id, types fixed (categorical inputs as strings, the others as floats, booleans 0/1)."""
    frame = frame.sort_values(["event_id", "predicted_at_ms", "request_id"], kind="stable")
    frame = frame.drop_duplicates("event_id", keep="first").reset_index(drop=True)
    for column in ("score", "label", *frame.columns[len(BASE_COLUMNS) :]):
        if is_categorical(frame[column]):
            frame[column] = frame[column].map(lambda v: None if v is None or v != v else str(v)).astype("string")
        else:
            frame[column] = pd.to_numeric(
                frame[column].map(lambda v: float(v) if isinstance(v, bool) else v), errors="coerce"
            ).astype("float64")
    for column in ("predicted_at_ms", "defaulted"):
        frame[column] = frame[column].astype("int64")
    frame["label_time_ms"] = frame["label_time_ms"].astype("Int64")
    return frame


def content_id(frame: pd.DataFrame) -> str:
    """A SHA-256 of the canonical content (columns and values), as the snapshot id (16 hex digits)."""
    digest = hashlib.sha256(json.dumps(list(frame.columns)).encode())
    buffer = io.StringIO()
    # CSV with full float precision: the same values always give the same text, whatever pandas writes parquet as.
    frame.to_csv(buffer, index=False, float_format="%.17g", na_rep="")
    digest.update(buffer.getvalue().encode())
    return digest.hexdigest()[:16]


def write_snapshot(
    frame: pd.DataFrame,
    root: str,
    *,
    kind: str,
    source: dict[str, Any],
    time_range: dict[str, int | None],
    label_kind: str = "binary",
) -> Manifest:
    """Write ``frame`` (``examples_frame`` columns) as an immutable snapshot under ``root``, its labels of
    ``label_kind`` (binary or numeric); its manifest.

    The same content always makes the same snapshot id; writing it again changes nothing."""
    if frame.empty:
        raise SnapshotError("no examples in that time range: nothing to snapshot (have labels been joined yet?)")
    frame = _canonical(frame)
    snapshot_id = content_id(frame)
    fs, base = fsspec.core.url_to_fs(root)
    folder = f"{base.rstrip('/')}/{snapshot_id}"
    if fs.exists(f"{folder}/{MANIFEST}"):
        return Manifest.from_json(fs.cat_file(f"{folder}/{MANIFEST}").decode())
    inputs = list(frame.columns[len(BASE_COLUMNS) :])
    days = pd.to_datetime(frame["predicted_at_ms"], unit="ms", utc=True).dt.strftime("%Y-%m-%d")
    for day, part in frame.groupby(days, sort=True):
        fs.makedirs(f"{folder}/data/date={day}", exist_ok=True)
        with fs.open(f"{folder}/data/date={day}/part-0.parquet", "wb") as handle:
            part.to_parquet(handle, index=False)
    labels = frame["label"]
    manifest = Manifest(
        snapshot_id=snapshot_id,
        created_at_ms=int(time.time() * 1000),
        kind=kind,
        schema_version=TrainingExample.SCHEMA_VERSION,
        rows=len(frame),
        time_range={
            **time_range,
            "first_ms": int(frame["predicted_at_ms"].min()),
            "last_ms": int(frame["predicted_at_ms"].max()),
        },
        features=inputs,
        label_balance=_label_balance(labels, label_kind),
        label_kind=label_kind,
        model_versions={str(v): int(n) for v, n in frame["model_version"].value_counts().sort_index().items()},
        source=source,
        reference=reference_statistics(frame, inputs),
    )
    with fs.open(f"{folder}/{MANIFEST}", "w") as handle:  # last: its presence marks a finished snapshot
        handle.write(manifest.to_json())
    return manifest


def _label_balance(labels: pd.Series, label_kind: str) -> dict[str, int]:
    """How many labels are positive and negative (binary), or labeled (numeric), and how many rows have none."""
    unlabeled = int(labels.isna().sum())
    if label_kind == "binary":
        return {"positive": int((labels == 1).sum()), "negative": int((labels == 0).sum()), "unlabeled": unlabeled}
    return {"labeled": len(labels) - unlabeled, "unlabeled": unlabeled}


def list_snapshots(root: str) -> list[Manifest]:
    """Every finished snapshot under ``root``, oldest first."""
    fs, base = fsspec.core.url_to_fs(root)
    if not fs.exists(base):
        return []
    manifests = [Manifest.from_json(fs.cat_file(path).decode()) for path in fs.glob(f"{base.rstrip('/')}/*/{MANIFEST}")]
    return sorted(manifests, key=lambda m: m.created_at_ms)


def find_snapshot(root: str, snapshot_id: str) -> tuple[Manifest, str]:
    """The manifest and folder URL of the snapshot whose id starts with ``snapshot_id``."""
    matches = [m for m in list_snapshots(root) if m.snapshot_id.startswith(snapshot_id)]
    if len(matches) != 1:
        known = ", ".join(m.snapshot_id for m in list_snapshots(root)) or "none"
        raise SnapshotError(
            f"{'no' if not matches else 'more than one'} snapshot {snapshot_id!r} under {root} (there are: {known})"
        )
    return matches[0], f"{root.rstrip('/')}/{matches[0].snapshot_id}"


def read_snapshot(root: str, snapshot_id: str) -> tuple[Manifest, pd.DataFrame]:
    """A snapshot's manifest and its examples (one frame)."""
    manifest, folder = find_snapshot(root, snapshot_id)
    fs, path = fsspec.core.url_to_fs(folder)
    parts = sorted(fs.glob(f"{path}/data/date=*/*.parquet"))
    frame = pd.concat([pd.read_parquet(fs.open(p, "rb")) for p in parts], ignore_index=True)
    return manifest, frame


def diff_snapshots(root: str, a: str, b: str) -> dict[str, Any]:
    """How snapshot ``b`` differs from ``a``: rows, label balance, features added or removed, and per shared
    feature the shift of its mean and missing rate and the skew of ``b``'s values against ``a``'s reference (PSI for
    every feature, L∞ for categories: the skew monitor's measures)."""
    first, _ = find_snapshot(root, a)
    second, frame = read_snapshot(root, b)
    shared = [name for name in first.features if name in second.features]
    features = {}
    for name in shared:
        ref, new = first.reference[name], second.reference[name]
        skew = feature_skew(name, ref, count_values(ref, frame[name].to_numpy(dtype=object)))
        features[name] = {
            "mean": [ref.mean, new.mean],
            "missing_rate": [ref.missing_rate, new.missing_rate],
            "psi": None if skew.psi is None else round(skew.psi, 4),
        } | ({"linf": round(skew.linf, 4)} if skew.linf is not None else {})
    return {
        "snapshots": [first.snapshot_id, second.snapshot_id],
        "rows": [first.rows, second.rows],
        "label_balance": [first.label_balance, second.label_balance],
        "features_added": [n for n in second.features if n not in first.features],
        "features_removed": [n for n in first.features if n not in second.features],
        "features": features,
    }


def time_range_label(manifest: Manifest) -> str:
    """The time range of a manifest as ISO timestamps (UTC)."""

    def iso(ms: int | None) -> str:
        return (
            "—" if ms is None or (isinstance(ms, float) and math.isnan(ms)) else pd.Timestamp(ms, unit="ms", tz="UTC").isoformat()
        )

    return f"{iso(manifest.time_range.get('first_ms'))} … {iso(manifest.time_range.get('last_ms'))}"
