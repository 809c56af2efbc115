"""Judging a trained candidate against prod, for real: DeepSpeed training on the CPU (one process), ONNX Runtime,
dynamic INT8 quantization and the MLflow registry on SQLite.

Two models are trained once for the module, on two snapshots with the same rows and the same
(time-based) holdout: one on the planted signal, one whose training labels were shuffled. With the
first as prod, the second is not registered, and its card says why; with the second as prod, the
first is registered with its card and tags, and goes out as a canary. ``loopline train`` registers
the first model of a registry (no prod to compare with). INT8 is kept or refused by its tolerance.
A third snapshot is crafted with defects (an input defaulted, so constant, in every row; an input
prod needs left out), and its card and registry version must name them, with their figures.
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

#: The integration tier: DeepSpeed trains each candidate for real.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_spec("torch") is None or find_spec("deepspeed") is None,
        reason="needs torch and deepspeed: pip install -e '.[train]' (make setup installs the train extra)",
    ),
]

FEATURES = [
    "user_transaction_features:txn_count_5m",
    "user_transaction_features:amount_sum_1h",
    "request:amount",
    "request:is_new_device",
]
ROWS, HOLDOUT_FRACTION, MODEL = 3000, 0.2, "fraud-test"
#: The crafted snapshot's input that the scorer defaulted (to 0) for every row.
DEFAULTED = "user_transaction_features:distinct_countries_24h"
#: Every field of a model card's JSON.
CARD_FIELDS = {
    "model",
    "version",
    "registered",
    "decision",
    "owner",
    "snapshot",
    "training",
    "metrics",
    "evaluation",
    "quantization",
    "known_defects",
    "defect_checks",
    "caveats",
    "created_at_ms",
}
CONFIG = {
    "hidden": [16, 8],
    "learning_rate": 0.01,
    "epochs": 2,
    "micro_batch_per_process": 32,
    "seed": 3,
    "holdout_fraction": HOLDOUT_FRACTION,
    "checkpoint_every_steps": 1000,
    "keep_last": 1,
}


def examples(shuffle_training_labels: bool, seed: int = 0) -> pd.DataFrame:
    """Snapshot rows (feedback_loop/snapshots.py columns) with fraud driven by three inputs, 5 % unlabeled. With
    ``shuffle_training_labels`` the labels of every labeled row before the holdout are permuted among themselves: the
    same rows, the same holdout with its true labels, and nothing left to learn."""
    rng = np.random.default_rng(seed)
    count, amount, new_device = rng.poisson(3, ROWS).astype(float), rng.lognormal(4, 1.2, ROWS), rng.integers(0, 2, ROWS)
    logit = 1.2 * (count - 3) + 2.0 * new_device + 1.8 * (np.log(amount) - 4) - 1.5
    label = (rng.random(ROWS) < 1 / (1 + np.exp(-logit))).astype(float)
    label[rng.random(ROWS) < 0.05] = np.nan
    if shuffle_training_labels:
        labeled = np.flatnonzero(~np.isnan(label))  # rows are in time order
        training = labeled[: len(labeled) - int(round(len(labeled) * HOLDOUT_FRACTION))]
        label[training] = np.random.default_rng(seed + 1).permutation(label[training])
    predicted_at = 1_790_000_000_000 + np.arange(ROWS, dtype=np.int64) * 1000
    return pd.DataFrame(
        {
            "event_id": [f"evt-{i:05d}" for i in range(ROWS)],
            "request_id": [f"req-{i:05d}" for i in range(ROWS)],
            "model_name": MODEL,
            "model_version": "1",
            "score": 0.5,
            "label": label,
            "label_source": np.where(np.isnan(label), None, "chargeback"),
            "predicted_at_ms": predicted_at,
            "label_time_ms": pd.array(np.where(np.isnan(label), pd.NA, predicted_at + 86_400_000), dtype="Int64"),
            "defaulted": 0,
            FEATURES[0]: count,
            FEATURES[1]: rng.gamma(2, 400, ROWS),
            FEATURES[2]: amount,
            FEATURES[3]: new_device.astype(float),
        }
    )


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    from feedback_loop.settings import FeedbackSettings
    from loopline.settings import Settings
    from offline_training.settings import ModelRegistrySettings
    from online.settings import ServingSettings

    home = tmp_path_factory.mktemp("retrain")
    (home / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    return Settings(
        home=home,
        serving=ServingSettings(model_name=MODEL),
        model_registry=ModelRegistrySettings(
            tracking_uri=f"sqlite:///{home}/mlflow.db", artifact_location=str(home / "artifacts")
        ),
        feedback=FeedbackSettings(train_config=home / "config.yaml", train_processes=1),
    )


@pytest.fixture(scope="module")
def snapshots(settings) -> dict[str, str]:
    """The snapshot ids: ``signal`` (true labels) and ``shuffled`` (training labels shuffled)."""
    from feedback_loop.snapshots import write_snapshot

    return {
        kind: write_snapshot(
            examples(kind == "shuffled"),
            settings.snapshots_root,
            kind="feedback",
            source={"test": kind},
            time_range={"from_ms": None, "to_ms": None},
        ).snapshot_id
        for kind in ("signal", "shuffled")
    }


@pytest.fixture(scope="module")
def first_registered(settings, snapshots):
    """`loopline train --snapshot <signal> --quantize --canary 5` in a registry without prod; then v1 is promoted."""
    from loopline.cli import app
    from loopline.components import model_release
    from loopline.settings import settings_environment

    result = CliRunner().invoke(
        app,
        ["train", "--snapshot", snapshots["signal"], "--quantize", "--canary", "5"],
        env=settings_environment(settings, LOOPLINE_RETRAIN__OWNER="fraud-team"),
    )
    assert result.exit_code == 0, result.output
    model_release(settings).promote(MODEL, "1", "test", "the model trained on the signal")
    return result.output


@pytest.fixture(scope="module")
def worse(settings, snapshots, first_registered):
    """Retraining on the shuffled snapshot with the signal's model as prod, asking for a canary."""
    from loopline.retraining import retrain

    return retrain(settings, snapshots["shuffled"], canary_percent=5, actor="test", reason="should never go out")


def _version_tags(settings, version: str) -> dict[str, str]:
    from loopline.components import model_release

    return model_release(settings).client.get_model_version(MODEL, version).tags


def test_first_model_is_registered_by_loopline_train_without_a_prod(settings, snapshots, first_registered):
    from loopline.retraining import run_folder

    assert "registered fraud-test v1: no prod model to compare with" in first_registered
    assert "no canary: there is no prod" in first_registered
    assert "INT8" in first_registered and "latency median ms" in first_registered
    tags = _version_tags(settings, "1")
    assert tags["loopline.snapshot_id"] == snapshots["signal"]
    assert tags["loopline.compared_with"] == "none"
    assert float(tags["loopline.holdout.auc"]) > 0.85
    card = json.loads(tags["loopline.model_card"])
    assert (card["version"], card["registered"], card["snapshot"]["id"]) == ("1", True, snapshots["signal"])
    run = run_folder(settings, snapshots["signal"])
    assert json.loads((run / "model_card.json").read_text()) == card
    # The INT8 model was kept (default tolerance) and is what v1 is: its file is the registered artifact.
    from schemas.model_registry import SHA256_TAG, artifact_sha256

    assert tags["loopline.precision"] == "int8"
    assert tags[SHA256_TAG] == artifact_sha256(run / "model.int8.onnx")


def test_candidate_worse_than_prod_is_not_registered(settings, worse):
    from loopline.components import model_release

    report = worse.report
    assert report.version is None and worse.canary_percent is None
    comparison = report.comparison
    assert comparison.prod_version == "1" and comparison.not_comparable is None
    assert comparison.prod["auc"] > 0.85 > 0.65 > comparison.candidate["auc"]
    assert not report.verdict.register
    assert "worse, more than the allowed 0.01" in report.verdict.reason
    release = model_release(settings)
    assert [str(v.version) for v in release.client.search_model_versions(f"name='{MODEL}'")] == ["1"]
    assert release.aliases(MODEL) == {"prod": "1"}
    card = json.loads((worse.run_dir / "model_card.json").read_text())
    assert (card["version"], card["registered"], card["decision"]) == (None, False, report.verdict.reason)
    assert card["evaluation"]["prod"]["auc"] == comparison.prod["auc"]
    markdown = report.card_path.read_text()
    assert "**Not registered**" in markdown and "| AUC |" in markdown and "prod v1" in markdown
    assert "positive-unlabeled" in markdown  # the snapshot's unlabeled rows are a caveat


def test_candidate_better_than_prod_is_registered_with_its_card_and_canary(settings, snapshots, worse):
    from loopline.components import model_release
    from loopline.retraining import evaluate_run

    release = model_release(settings)
    bad = release.register(MODEL, worse.run_dir / "model.onnx")
    release.promote(MODEL, bad, "test", "a prod that has decayed")

    outcome = evaluate_run(settings, snapshots["signal"], quantize=False, canary_percent=5, actor="test", reason="beats prod")

    report = outcome.report
    assert report.verdict.register, report.verdict.reason
    assert report.comparison.prod_version == bad
    assert report.comparison.candidate["auc"] > report.comparison.prod["auc"] + 0.2
    assert report.version == str(int(bad) + 1)
    assert release.aliases(MODEL) == {"prod": bad, "canary": report.version}
    assert outcome.canary_percent == 5
    last = release.history(MODEL)[-1]
    assert (last.actor, last.alias, last.version, last.reason) == ("test", "canary", report.version, "beats prod")
    tags = _version_tags(settings, report.version)
    assert tags["loopline.compared_with"] == f"v{bad}" and tags["loopline.precision"] == "fp32"
    assert tags["loopline.snapshot_id"] == snapshots["signal"]
    assert float(tags["loopline.holdout.auc"]) == pytest.approx(report.comparison.candidate["auc"], abs=1e-6)
    card = json.loads(tags["loopline.model_card"])
    assert (card["version"], card["registered"], card["evaluation"]["prod_version"]) == (report.version, True, bad)
    assert f"# Model card: {MODEL} v{report.version}" in report.card_path.read_text()


def test_quantized_model_is_kept_or_refused_by_its_tolerance(settings, snapshots, first_registered, tmp_path):
    import shutil

    from feedback_loop.snapshots import find_snapshot
    from loopline.retraining import run_folder
    from offline_training.evaluation import Quality
    from offline_training.quantization import QUANTIZED_FILE, quantize_int8
    from offline_training.training_data import load_snapshot
    from online.onnx_runtime import OnnxModel

    run = tmp_path  # a copy: the run's own INT8 file is what v1 was registered from
    shutil.copy(run_folder(settings, snapshots["signal"]) / "model.onnx", run / "model.onnx")
    snapshot = load_snapshot(Path(find_snapshot(settings.snapshots_root, snapshots["signal"])[1]), HOLDOUT_FRACTION)
    rows, labels, binary = snapshot.holdout, snapshot.holdout_y, Quality("binary")

    kept = quantize_int8(run / "model.onnx", rows, labels, binary, max_change=0.05, repeats=100)
    assert kept.kept and kept.path == run / QUANTIZED_FILE and kept.path.is_file()
    assert kept.headline == "auc" and abs(kept.change) <= 0.05
    assert [spec.name for spec in OnnxModel(kept.path, MODEL, "int8").inputs] == FEATURES  # still the scorer's model contract
    for latency in (kept.fp32_latency, kept.int8_latency):
        assert 0 < latency.median_ms <= latency.p99_ms
    assert kept.latency_gain == pytest.approx(kept.fp32_latency.median_ms / kept.int8_latency.median_ms)

    assert kept.change != 0, "INT8 scored the holdout exactly as fp32: no tolerance can refuse it"
    refused = quantize_int8(run / "model.onnx", rows, labels, binary, max_change=abs(kept.change) / 2, repeats=100)
    assert not refused.kept and refused.path is None
    assert not (run / QUANTIZED_FILE).exists()  # a refused file cannot be registered by mistake
    assert refused.int8["auc"] == kept.int8["auc"]
    assert "more than the tolerance" in refused.reason


def test_prod_that_cannot_score_the_snapshot_is_not_comparable(settings, snapshots, first_registered, tmp_path):
    from feedback_loop.snapshots import find_snapshot
    from loopline.retraining import run_folder
    from offline_training.candidate import ProdModel, compare_with_prod, registration_gate
    from offline_training.onnx_models import write_linear_model
    from offline_training.training_data import load_snapshot

    snapshot = load_snapshot(Path(find_snapshot(settings.snapshots_root, snapshots["signal"])[1]), HOLDOUT_FRACTION)
    candidate = run_folder(settings, snapshots["signal"]) / "model.onnx"
    other_inputs = write_linear_model(tmp_path / "prod.onnx", [*FEATURES, "request:channel"], np.ones(len(FEATURES) + 1), 0.0)

    comparison = compare_with_prod(candidate, snapshot, ProdModel("7", other_inputs))
    assert comparison.prod is None and comparison.prod_version == "7"
    assert "request:channel" in comparison.not_comparable
    verdict = registration_gate(comparison, allowed=0.0)
    assert verdict.register and "not comparable" in verdict.reason

    unavailable = compare_with_prod(candidate, snapshot, ProdModel("7", None, "artifact sha256 mismatch"))
    assert unavailable.not_comparable == "artifact sha256 mismatch" and unavailable.prod is None


@pytest.fixture(scope="module")
def crafted(settings, first_registered) -> str:
    """`loopline train --owner alice` (the settings naming another owner) on a snapshot crafted with defects: the
    scorer defaulted one input (to 0) in every row, another is missing in most rows, and an input prod needs is left
    out (so prod is not comparable and the candidate is registered); the snapshot id."""
    from feedback_loop.snapshots import write_snapshot
    from loopline.cli import app
    from loopline.settings import settings_environment

    frame = examples(False, seed=4).drop(columns=FEATURES[1])
    frame.loc[np.random.default_rng(5).random(ROWS) < 0.6, FEATURES[3]] = np.nan
    frame[DEFAULTED], frame["defaulted"] = 0.0, 1
    snapshot_id = write_snapshot(
        frame, settings.snapshots_root, kind="feedback", source={"test": "crafted"}, time_range={"from_ms": None, "to_ms": None}
    ).snapshot_id
    result = CliRunner().invoke(
        app,
        ["train", "--snapshot", snapshot_id, "--owner", "alice"],
        env=settings_environment(settings, LOOPLINE_RETRAIN__OWNER="fraud-team"),
    )
    assert result.exit_code == 0, result.output
    return snapshot_id


def _checks(card: dict) -> list[str]:
    return [defect["check"] for defect in card["known_defects"]]


def test_registered_version_carries_its_card_with_the_settings_owner(settings, snapshots, first_registered):
    from loopline.components import model_release
    from offline_training.candidate import CARD_TAG, DEFECTS_TAG, OWNER_TAG
    from offline_training.model_card import METRIC_LABELS

    version = model_release(settings).client.get_model_version(MODEL, "1")
    card = json.loads(version.tags[CARD_TAG])
    assert set(card) == CARD_FIELDS
    # No --owner: the owner is the setting, here from LOOPLINE_RETRAIN__OWNER.
    assert (card["version"], card["owner"], version.tags[OWNER_TAG]) == ("1", "fraud-team", "fraud-team")
    assert set(card["metrics"]) == set(METRIC_LABELS["binary"])
    assert card["metrics"] == card["quantization"]["int8"]  # the metrics of the file registered: the kept INT8 one
    assert card["defect_checks"] and all(set(defect) == {"check", "statement", "figures"} for defect in card["known_defects"])
    statements = [defect["statement"] for defect in card["known_defects"]]
    assert json.loads(version.tags[DEFECTS_TAG]) == statements
    assert "**Owner**: fraud-team" in version.description and f"snapshot `{snapshots['signal']}`" in version.description
    for statement in statements or ["None found. Checked for: "]:
        assert statement in version.description
    quantization = card["quantization"]
    slower = quantization["int8_latency"]["median_ms"] > quantization["fp32_latency"]["median_ms"]
    assert ("int8_slower" in _checks(card)) == slower
    # The healthy snapshot: nothing defaulted, missing or constant, and no prod to be incomparable with.
    assert not {"defaulted_inputs", "missing_input", "constant_input", "not_comparable"} & set(_checks(card))


def test_refused_candidate_card_has_the_default_owner_and_its_defect_against_prod(worse):
    import getpass

    from feedback_loop.settings import os_user

    card = json.loads((worse.run_dir / "model_card.json").read_text())
    assert set(card) == CARD_FIELDS and (card["version"], card["registered"]) == (None, False)
    assert card["owner"] == os_user() == getpass.getuser()  # nothing set: the OS user training
    comparison = worse.report.comparison
    [defect] = [d for d in card["known_defects"] if d["check"] == "worse_than_prod"]
    assert defect["figures"] == {"auc": comparison.candidate["auc"], "prod_auc": comparison.prod["auc"], "prod_version": "1"}
    assert f"{comparison.candidate['auc']:.4f}" in defect["statement"] and f"{comparison.prod['auc']:.4f}" in defect["statement"]
    assert defect["statement"] in worse.report.card_path.read_text()


def test_crafted_snapshot_defects_are_on_the_card_and_the_registry_version(settings, crafted):
    from feedback_loop.snapshots import find_snapshot
    from loopline.components import model_release
    from loopline.retraining import run_folder
    from offline_training.candidate import CARD_TAG, DEFECTS_TAG, OWNER_TAG
    from offline_training.training_data import load_snapshot

    card = json.loads((run_folder(settings, crafted) / "model_card.json").read_text())
    assert set(card) == CARD_FIELDS and card["owner"] == "alice"  # --owner over the settings' owner
    assert card["registered"], card["decision"]
    training = load_snapshot(Path(find_snapshot(settings.snapshots_root, crafted)[1]), HOLDOUT_FRACTION)
    rows, missing = len(training.train_y), int(training.train[FEATURES[3]].isna().sum())
    defects = {defect["check"]: defect for defect in card["known_defects"]}
    assert _checks(card).count("constant_input") == 1 and _checks(card).count("missing_input") == 1
    assert defects["constant_input"]["figures"] == {"input": DEFAULTED, "value": 0.0, "rows": rows}
    assert defects["defaulted_inputs"]["figures"]["rows_defaulted"] == defects["defaulted_inputs"]["figures"]["rows"] == rows
    assert f"{rows:,} of {rows:,} training rows (100%)" in defects["defaulted_inputs"]["statement"]
    assert defects["missing_input"]["figures"] == {"input": FEATURES[3], "rows_missing": missing, "rows": rows, "bound": 0.5}
    assert f"{missing:,} of {rows:,}" in defects["missing_input"]["statement"]
    assert FEATURES[1] in defects["not_comparable"]["statement"]  # prod needs the input the snapshot left out

    version = model_release(settings).client.get_model_version(MODEL, card["version"])
    assert json.loads(version.tags[CARD_TAG]) == card and version.tags[OWNER_TAG] == "alice"
    assert json.loads(version.tags[DEFECTS_TAG]) == [defect["statement"] for defect in card["known_defects"]]
    markdown = (run_folder(settings, crafted) / "model_card.md").read_text()
    for defect in card["known_defects"]:
        assert defect["statement"] in version.description and defect["statement"] in markdown


def test_holdout_defects_follow_their_bounds_and_a_card_without_defects_says_so(settings, snapshots, first_registered, tmp_path):
    import shutil
    from dataclasses import replace

    from feedback_loop.snapshots import find_snapshot
    from loopline.retraining import run_folder
    from offline_training.candidate import compare_with_prod, evaluate_and_register
    from offline_training.known_defects import DefectBounds, KnownDefect, known_defects
    from offline_training.model_card import DESCRIPTION_LIMIT
    from offline_training.release import ModelRelease
    from offline_training.training_data import load_snapshot

    folder = Path(find_snapshot(settings.snapshots_root, snapshots["signal"])[1])
    snapshot = load_snapshot(folder, HOLDOUT_FRACTION)
    for name in ("model.onnx", "metrics.json"):  # a copy: the run's own card stays v1's
        shutil.copy(run_folder(settings, snapshots["signal"]) / name, tmp_path / name)
    comparison = compare_with_prod(tmp_path / "model.onnx", snapshot, None)
    metrics = comparison.candidate

    strict = DefectBounds(max_calibration_error=0.0, min_recall=1.01, min_holdout_class_rows=10**6)
    defects = {defect.check: defect for defect in known_defects(snapshot, comparison, metrics, None, strict)}
    assert set(defects) == {"calibration_error", "recall_at_threshold", "small_holdout"}
    assert defects["calibration_error"].figures["calibration_error"] == metrics["calibration_error"] > 0
    assert defects["recall_at_threshold"].figures["recall"] == metrics["recall"]
    assert defects["small_holdout"].figures["positives"] == comparison.holdout_positives
    assert f"{metrics['calibration_error']:.3f}" in defects["calibration_error"].statement

    lenient = DefectBounds(max_calibration_error=1.0, min_recall=0.0, min_holdout_class_rows=0)
    release = ModelRelease(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "artifacts"))
    report = evaluate_and_register(tmp_path, folder, HOLDOUT_FRACTION, release, MODEL, None, owner="bob", defect_bounds=lenient)
    assert report.version == "1" and report.card.known_defects == []
    said = "None found. Checked for: " + "; ".join(lenient.checks())
    assert said in report.card_path.read_text()
    assert said in release.client.get_model_version(MODEL, "1").description

    # More defects than a registry description holds: those that fit, and how many more the tag lists.
    many = [KnownDefect("constant_input", f"input {i} is constant " + "x" * 200, {"input": str(i)}) for i in range(60)]
    description = replace(report.card, known_defects=many).model_registry_description()
    listed = [line for line in description.splitlines() if line.startswith("- input ")]
    assert len(description) <= DESCRIPTION_LIMIT and 0 < len(listed) < len(many)
    assert description.endswith(f"- … and {len(many) - len(listed)} more: see the `loopline.known_defects` tag")
