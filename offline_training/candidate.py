"""Judging a finished training run: the candidate against ``prod`` on the same holdout rows, an optional INT8
version, a model card, and registration only when the candidate is not worse than prod.

* Same rows: both models score the time-based holdout of the run's snapshot (the split training
  used, so no row either trained on) through ONNX Runtime, each taking the snapshot's columns its
  metadata names. A prod whose inputs the snapshot lacks, or whose file could not be had, is
  reported as not comparable; the candidate is then judged on its own.
* The gate, by the label's kind (``offline_training/evaluation.Quality``): the model to be registered (INT8 when it
  was kept, else fp32) must have a holdout AUC no more than ``max_auc_drop`` below prod's (binary), or a holdout RMSE
  no more than ``max_rmse_increase`` (relative) above prod's (numeric). No prod, or none comparable, passes; a
  headline that cannot be measured (an AUC over a holdout of one class) does not.
* A registered version is tagged with its snapshot id, its holdout metrics, the prod version it was
  compared with, its precision (fp32 or int8), its owner, its known defects (a JSON list of statements)
  and the model card as JSON; its description is the card in brief (``ModelCard.model_registry_description``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from offline_training.evaluation import Quality
from offline_training.known_defects import DefectBounds, known_defects
from offline_training.model_card import ModelCard, caveats, write_card
from offline_training.onnx_scoring import cpu_session, scores
from offline_training.quantization import QuantizationResult, quantize_int8
from offline_training.release import ModelRelease
from offline_training.training_data import Snapshot, load_snapshot

#: Version tags a registered candidate carries (beside the registry's own, schemas/model_registry.py).
SNAPSHOT_TAG = "loopline.snapshot_id"
METRIC_TAG_PREFIX = "loopline.holdout."
COMPARED_WITH_TAG = "loopline.compared_with"
PRECISION_TAG = "loopline.precision"
CARD_TAG = "loopline.model_card"
OWNER_TAG = "loopline.owner"
DEFECTS_TAG = "loopline.known_defects"


@dataclass(frozen=True)
class ProdModel:
    """The version ``prod`` names and its ONNX file; ``path`` is None when the file could not be had (``problem``: why)."""

    version: str
    path: Path | None
    problem: str = ""


@dataclass(frozen=True)
class Comparison:
    """The candidate's and prod's holdout metrics on the same rows (``prod`` None: no prod, or ``not_comparable``)."""

    snapshot_id: str
    threshold: float
    holdout_rows: int
    #: Binary labels: how many holdout rows are positive (None for a numeric label).
    holdout_positives: int | None
    candidate: dict[str, float]
    prod_version: str | None = None
    prod: dict[str, float] | None = None
    not_comparable: str | None = None
    label_kind: str = "binary"

    @property
    def quality(self) -> Quality:
        return Quality(self.label_kind)  # type: ignore[arg-type]


@dataclass(frozen=True)
class GateVerdict:
    """Whether the candidate is registered, and why."""

    register: bool
    reason: str


@dataclass(frozen=True)
class CandidateReport:
    """Everything judging a run produced: the comparison, INT8's result, the verdict, the version (None: not
    registered), the file registered or that would have been, the model card and its Markdown file's path."""

    comparison: Comparison
    quantization: QuantizationResult | None
    verdict: GateVerdict
    version: str | None
    model_path: Path
    card: ModelCard
    card_path: Path


def holdout_metrics(model_path: Path, snapshot: Snapshot, threshold: float) -> dict[str, float]:
    """The model file's metrics on the snapshot's holdout, by its label's kind; :class:`NotComparable` when it needs
    inputs the snapshot lacks."""
    return Quality(snapshot.label_kind).metrics(scores(cpu_session(model_path), snapshot.holdout), snapshot.holdout_y, threshold)


def compare_with_prod(candidate_path: Path, snapshot: Snapshot, prod: ProdModel | None, threshold: float = 0.5) -> Comparison:
    """The candidate at ``candidate_path`` and ``prod`` scored on the same holdout rows of ``snapshot``."""
    positives = int((snapshot.holdout_y == 1).sum()) if snapshot.label_kind == "binary" else None
    comparison = Comparison(
        snapshot.snapshot_id,
        threshold,
        len(snapshot.holdout_y),
        positives,
        holdout_metrics(candidate_path, snapshot, threshold),
        label_kind=snapshot.label_kind,
    )
    if prod is None:
        return comparison
    if prod.path is None:
        return replace(comparison, prod_version=prod.version, not_comparable=prod.problem)
    try:
        return replace(comparison, prod_version=prod.version, prod=holdout_metrics(prod.path, snapshot, threshold))
    except ValueError as err:  # NotComparable, or metadata that names no inputs
        return replace(comparison, prod_version=prod.version, not_comparable=str(err))


def registration_gate(comparison: Comparison, allowed: float, quantization: QuantizationResult | None = None) -> GateVerdict:
    """Register the model to be registered (INT8 when kept) only if its headline metric falls short of prod's by at
    most ``allowed`` in the headline's terms (AUC points for a binary label, a relative RMSE increase for a numeric
    one)."""
    quality = comparison.quality
    kept = quantization is not None and quantization.kept
    ours = (quantization.int8 if kept else comparison.candidate)[quality.headline]
    which = "INT8 candidate" if kept else "candidate"
    rows = f"{comparison.holdout_rows:,} holdout rows"
    if not quality.measurable(ours):
        return GateVerdict(
            False,
            f"the {which}'s {quality.headline.upper()} cannot be measured on {rows} (a binary label of "
            "one class): a snapshot with both outcomes is needed",
        )
    if comparison.prod_version is None:
        return GateVerdict(True, f"no prod model to compare with; {which} {quality.describe(ours)} on {rows}")
    if comparison.prod is None:
        return GateVerdict(
            True,
            f"prod v{comparison.prod_version} is not comparable ({comparison.not_comparable}); "
            f"{which} {quality.describe(ours)} on {rows}, the canary will compare them on live traffic",
        )
    prods = comparison.prod[quality.headline]
    versus = f"{which} {quality.describe(ours)} vs prod v{comparison.prod_version} {quality.describe(prods)} on the same {rows}"
    shortfall = quality.shortfall(ours, prods)
    if shortfall > allowed:
        return GateVerdict(False, f"{versus}: {shortfall:.4f} worse, more than the allowed {quality.describe_allowance(allowed)}")
    return GateVerdict(True, f"{versus} (allowed {quality.describe_allowance(allowed)} worse)")


def _version_tags(card: ModelCard, comparison: Comparison, int8: bool) -> dict[str, str]:
    """The tags that record what a registered version is (see the module docstring)."""
    return {
        SNAPSHOT_TAG: comparison.snapshot_id,
        **{f"{METRIC_TAG_PREFIX}{name}": f"{value:.6g}" for name, value in card.metrics.items()},
        COMPARED_WITH_TAG: "none" if comparison.prod is None else f"v{comparison.prod_version}",
        PRECISION_TAG: "int8" if int8 else "fp32",
        OWNER_TAG: card.owner,
        DEFECTS_TAG: json.dumps([defect.statement for defect in card.known_defects]),
        CARD_TAG: card.to_json(),
    }


def evaluate_and_register(
    run_dir: Path,
    snapshot_dir: Path | str,
    holdout_fraction: float,
    release: ModelRelease,
    name: str,
    prod: ProdModel | None,
    *,
    owner: str,
    threshold: float = 0.5,
    max_auc_drop: float = 0.01,
    max_rmse_increase: float = 0.05,
    quantize: bool = False,
    max_quantized_change: float = 0.005,
    defect_bounds: DefectBounds = DefectBounds(),
) -> CandidateReport:
    """Judge the run in ``run_dir`` (``model.onnx``, ``metrics.json``) trained on the snapshot at ``snapshot_dir`` (a path
    or an fsspec URL) with ``holdout_fraction``: compare with ``prod``, optionally quantize (kept within
    ``max_quantized_change`` of fp32, in the headline's terms), register it as a new version of ``name`` when the gate
    passes (``max_auc_drop`` for a binary label, ``max_rmse_increase`` for a numeric one), and write the model card
    (``owner``'s, its known defects found within ``defect_bounds``) with the version registered. ValueError when the
    run's holdout is not this one (another split)."""
    run_dir = Path(run_dir)
    snapshot = load_snapshot(snapshot_dir, holdout_fraction)
    training = json.loads((run_dir / "metrics.json").read_text())
    if (training["snapshot_id"], training["rows"]["holdout"]) != (snapshot.snapshot_id, len(snapshot.holdout_y)):
        raise ValueError(
            f"{run_dir} was trained on snapshot {training['snapshot_id']} with a holdout of "
            f"{training['rows']['holdout']} rows, not {snapshot.snapshot_id} with {len(snapshot.holdout_y)}: "
            "evaluate it with the holdout fraction it was trained with, or rows it trained on would "
            "count"
        )
    candidate_path = run_dir / "model.onnx"
    comparison = compare_with_prod(candidate_path, snapshot, prod, threshold)
    quality = comparison.quality
    quantization = None
    if quantize:
        quantization = quantize_int8(
            candidate_path, snapshot.holdout, snapshot.holdout_y, quality, max_change=max_quantized_change, threshold=threshold
        )
    verdict = registration_gate(comparison, quality.allowance(max_auc_drop, max_rmse_increase), quantization)
    int8 = quantization is not None and quantization.kept
    model_path = quantization.path if int8 else candidate_path
    manifest = snapshot.manifest
    metrics = quantization.int8 if int8 else comparison.candidate
    card = ModelCard(
        model=name,
        version=None,
        registered=verdict.register,
        decision=verdict.reason,
        owner=owner,
        snapshot={
            "id": snapshot.snapshot_id,
            **{key: manifest.get(key) for key in ("kind", "label_kind", "rows", "time_range", "label_balance", "model_versions")},
        },
        training=training,
        metrics=metrics,
        evaluation=asdict(comparison),
        quantization=None if quantization is None else asdict(quantization),
        known_defects=known_defects(snapshot, comparison, metrics, quantization, defect_bounds),
        defect_checks=defect_bounds.checks(),
        caveats=caveats(manifest),
        created_at_ms=int(time.time() * 1000),
    )
    version = None
    if verdict.register:
        version = release.register(name, model_path, description=card.model_registry_description())
        card = replace(card, version=version)
        for key, value in _version_tags(card, comparison, int8).items():
            release.client.set_model_version_tag(name, version, key, value)
    return CandidateReport(comparison, quantization, verdict, version, model_path, card, write_card(card, run_dir))
