"""A model card: what a trained candidate is, who answers for it, what it was trained and judged on, how it compares
with ``prod``, its known defects (``known_defects.py``) and what its numbers do not say.

Written into the run's folder as ``model_card.json`` and ``model_card.md`` for people, after registration so it
carries the registered version (a refused candidate's card says it was not registered, and why). A registered
version carries the same JSON on its ``loopline.model_card`` tag and :meth:`ModelCard.model_registry_description` as its
description. Missing values (an AUC on one class, a precision with nothing flagged) are ``null`` in the JSON and "—"
in the text. Its metrics follow the label's kind: ranking and calibration for a binary label, errors for a numeric one.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from offline_training.known_defects import KnownDefect

JSON_FILE, MARKDOWN_FILE = "model_card.json", "model_card.md"
#: The longest description MLflow's SQL stores keep for a model version (its column is 5,000 characters).
DESCRIPTION_LIMIT = 5000
#: The metrics the card's table shows, by the label's kind, in order, with their labels.
METRIC_LABELS = {
    "binary": {
        "auc": "AUC",
        "log_loss": "log loss",
        "brier": "Brier",
        "precision": "precision @ t",
        "recall": "recall @ t",
        "calibration_error": "calibration error",
    },
    "numeric": {"rmse": "RMSE", "mae": "MAE", "mean_error": "mean error", "r2": "R²"},
}


@dataclass(frozen=True)
class ModelCard:
    """The card of one candidate; ``version`` is set once it is registered. ``metrics`` are the holdout metrics of the
    file registered (or that would have been: INT8 when it was kept), ``defect_checks`` what ``known_defects`` were
    looked for."""

    model: str
    version: str | None
    registered: bool
    decision: str
    owner: str
    snapshot: dict[str, Any]
    training: dict[str, Any]
    metrics: dict[str, float]
    evaluation: dict[str, Any]
    quantization: dict[str, Any] | None
    known_defects: list[KnownDefect]
    defect_checks: list[str]
    caveats: list[str]
    created_at_ms: int

    def to_json(self) -> str:
        """The card as JSON (missing numbers as null)."""
        return json.dumps(_without_nan(asdict(self)), indent=2, sort_keys=True, default=str)

    def markdown(self) -> str:
        """The card for people."""
        evaluation, quantization = self.evaluation, self.quantization
        title = f"{self.model} v{self.version}" if self.version else f"{self.model} (candidate, not registered)"
        columns = {"candidate": evaluation["candidate"]}
        if evaluation.get("prod") is not None:
            columns[f"prod v{evaluation['prod_version']}"] = evaluation["prod"]
        if quantization is not None:
            columns["candidate INT8" + ("" if quantization["kept"] else " (refused)")] = quantization["int8"]
        state = "Registered" if self.registered else "Not registered"
        lines = [
            f"# Model card: {title}",
            "",
            f"**{state}**: {self.decision}",
            "",
            f"**Owner**: {self.owner}",
            "",
            f"Holdout: the latest {evaluation['holdout_rows']:,} labeled rows of snapshot `{self.snapshot['id']}`"
            f"{self._holdout_detail()}.",
            "",
            "| metric | " + " | ".join(columns) + " |",
            "|---" * (len(columns) + 1) + "|",
        ]
        for key, label in self._labels().items():
            lines.append(f"| {label} | " + " | ".join(_number(metrics.get(key)) for metrics in columns.values()) + " |")
        lines += [
            "",
            "## Data",
            "",
            _snapshot_line(self.snapshot),
            "",
            "## Training",
            "",
            _training_line(self.training),
            "",
            "## Comparison with prod",
            "",
            _comparison_line(evaluation),
        ]
        if quantization is not None:
            fp32, int8 = quantization["fp32_latency"], quantization["int8_latency"]
            lines += [
                "",
                "## Quantization (dynamic INT8, CPU)",
                "",
                quantization["reason"] + ".",
                "",
                f"Latency per batch of {quantization['batch_size']} over {quantization['repeats']} repeats: fp32 median "
                f"{fp32['median_ms']:.3f} ms, p99 {fp32['p99_ms']:.3f} ms; INT8 median {int8['median_ms']:.3f} ms, p99 "
                f"{int8['p99_ms']:.3f} ms: a latency gain of ×{fp32['median_ms'] / int8['median_ms']:.2f} "
                "(fp32 median ÷ INT8 median).",
            ]
        lines += [
            "",
            "## Known defects",
            "",
            *self._defect_lines(),
            "",
            "## Caveats",
            "",
            *(f"- {caveat}" for caveat in self.caveats),
        ]
        return "\n".join(lines) + "\n"

    def model_registry_description(self) -> str:
        """The card in brief for the registry version's description (MLflow shows it as Markdown): owner, snapshot,
        decision, the registered file's holdout metrics and the known defects, within :data:`DESCRIPTION_LIMIT`
        (defects that do not fit are counted; all of them are on the ``loopline.known_defects`` tag)."""
        evaluation = self.evaluation
        scores = ", ".join(f"{label} {_number(self.metrics.get(key))}" for key, label in self._labels().items())
        head = [
            f"**Owner**: {self.owner}",
            "",
            f"**Trained on** snapshot `{self.snapshot['id']}`; {self.decision}.",
            "",
            f"**Holdout** ({evaluation['holdout_rows']:,} rows{self._holdout_detail()}): {scores}.",
            "",
            "**Known defects**:",
            "",
        ]
        lines = self._defect_lines()
        for kept in range(len(lines), -1, -1):
            left_out = [f"- … and {len(lines) - kept} more: see the `loopline.known_defects` tag"] if kept < len(lines) else []
            text = "\n".join(head + lines[:kept] + left_out)
            if len(text) <= DESCRIPTION_LIMIT:
                return text
        return text[:DESCRIPTION_LIMIT]  # a decision too long on its own

    def _labels(self) -> dict[str, str]:
        return METRIC_LABELS[self.evaluation.get("label_kind", "binary")]

    def _holdout_detail(self) -> str:
        """Of a binary label's holdout, its positives and the operating threshold; nothing for a numeric one."""
        evaluation = self.evaluation
        if evaluation.get("label_kind", "binary") == "numeric":
            return ""
        return f", {evaluation['holdout_positives']:,} positive; operating threshold t = {evaluation['threshold']:g}"

    def _defect_lines(self) -> list[str]:
        if self.known_defects:
            return [f"- {defect.statement}" for defect in self.known_defects]
        return ["None found. Checked for: " + "; ".join(self.defect_checks) + "."]


def caveats(manifest: dict[str, Any]) -> list[str]:
    """What the card's numbers do not say (beside its known defects), from the snapshot's manifest."""
    notes = []
    unlabeled = manifest.get("label_balance", {}).get("unlabeled", 0)
    if unlabeled and manifest.get("label_kind", "binary") == "binary":
        notes.append(
            f"{unlabeled:,} of the snapshot's {manifest.get('rows', 0):,} rows had no label at the feedback horizon and "
            "are left out of training and evaluation; most are negatives, but a positive never reported looks the "
            "same (positive-unlabeled), so these metrics describe labeled rows only"
        )
    elif unlabeled:
        notes.append(
            f"{unlabeled:,} of the snapshot's {manifest.get('rows', 0):,} rows had no label at the feedback horizon and "
            "are left out of training and evaluation: if outcomes go missing for a reason (the longest ones, say), "
            "these metrics describe the rest only"
        )
    notes.append(
        "labels arrive late: the holdout is the most recent rows, whose labels are the least complete when the "
        "snapshot was taken, and a late label would move its figures"
    )
    if manifest.get("kind") == "backfill":
        notes.append("a backfilled snapshot: features were recomputed from the event log, not the values a scorer served")
    return notes


def write_card(card: ModelCard, folder: Path) -> Path:
    """Write ``model_card.json`` and ``model_card.md`` into ``folder``; the path of the Markdown one."""
    folder = Path(folder)
    (folder / JSON_FILE).write_text(card.to_json() + "\n")
    (folder / MARKDOWN_FILE).write_text(card.markdown())
    return folder / MARKDOWN_FILE


def _without_nan(value: Any) -> Any:
    """``value`` with every NaN replaced by None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {key: _without_nan(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _number(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def _iso(ms: int | None) -> str:
    return "—" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _snapshot_line(snapshot: dict[str, Any]) -> str:
    balance = snapshot.get("label_balance") or {}
    scored = snapshot.get("time_range") or {}
    labels = ", ".join(f"{n:,} {kind}" for kind, n in balance.items()) or "not recorded"
    return (
        f"Snapshot `{snapshot['id']}` ({snapshot.get('kind') or 'kind not recorded'}): {snapshot.get('rows', 0):,} rows "
        f"scored {_iso(scored.get('first_ms'))} … {_iso(scored.get('last_ms'))} by model versions "
        f"{snapshot.get('model_versions') or 'not recorded'}; labels: {labels}."
    )


def _training_line(training: dict[str, Any]) -> str:
    rows = training.get("rows", {})
    return (
        f"{rows.get('train', 0):,} training rows, {training.get('epochs')} epochs, {training.get('global_steps')} optimizer "
        f"steps at world size {training.get('world_size')} in {training.get('seconds')} s "
        f"({training.get('samples_per_second')} samples/s); the ONNX export scores within "
        f"{training.get('onnx_max_abs_diff', float('nan')):.2g} of torch."
    )


def _comparison_line(evaluation: dict[str, Any]) -> str:
    if evaluation.get("prod_version") is None:
        return "There was no prod model to compare with."
    if evaluation.get("not_comparable"):
        return f"prod v{evaluation['prod_version']} could not be scored on these rows: {evaluation['not_comparable']}."
    return f"prod v{evaluation['prod_version']} scored the same holdout rows (its ONNX file, as serving downloads it)."
