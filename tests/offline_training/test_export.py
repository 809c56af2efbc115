"""A model with text inputs (the delivery template's: a courier's last zone, the order's cuisine) exports to ONNX
with the texts' lookup inside the graph: ONNX Runtime, given the raw texts, scores as torch does, given their codes;
a word it never learnt and a missing text both take the unknown code; and the export is admitted for the project."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from feature_store.model_inputs import typed_inputs
from offline_training.export import export_onnx, torch_scores, verify_onnx
from offline_training.model import TabularMLP
from offline_training.onnx_scoring import cpu_session, scores
from online.model_admission import admit_model
from tests.support.templates import DELIVERY

VOCABULARIES = {"courier_features:last_zone": ["z00", "z01", "z02"], "request:cuisine": ["pizza", "sushi"]}


def _model() -> TabularMLP:
    inputs = typed_inputs(DELIVERY.feature_repo, DELIVERY.spec.model.inputs)
    numbers = sum(i.kind == "number" for i in inputs)
    model = TabularMLP(
        inputs, [16], np.zeros(numbers), np.ones(numbers), vocabularies=VOCABULARIES, kind="numeric", target=(30.0, 8.0)
    )
    with torch.no_grad():  # embeddings apart enough that a word's code shows in the score
        for embedding in model.embeddings:
            embedding.weight.mul_(10)
    return model


def _frame(model: TabularMLP, rows: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = {}
    for spec in model.inputs:
        if spec.kind == "number":
            frame[spec.name] = np.where(rng.random(rows) < 0.1, np.nan, rng.normal(0, 3, rows))
        else:
            words = [*VOCABULARIES[spec.name], "never-seen", None]
            frame[spec.name] = [words[i % len(words)] for i in range(rows)]
    return pd.DataFrame(frame)


def test_texts_are_looked_up_inside_the_exported_model(tmp_path: Path) -> None:
    model = _model()
    path = export_onnx(model, tmp_path / "model.onnx")
    frame = _frame(model)
    assert verify_onnx(model, path, frame) <= 1e-5
    session = cpu_session(path)
    assert {i.name for i in session.get_inputs()} == {"features", "categories"}
    # The same row with each cuisine: the learnt words score apart, an unknown one and a missing one alike.
    row = frame.iloc[[0] * 4].reset_index(drop=True)
    row["request:cuisine"] = ["pizza", "sushi", "tapas", None]
    by_cuisine = scores(session, row)
    assert by_cuisine[0] != by_cuisine[1] and by_cuisine[2] == by_cuisine[3]
    np.testing.assert_allclose(by_cuisine, torch_scores(model, row), rtol=1e-5)


def test_the_exported_model_is_admitted_for_the_project(tmp_path: Path) -> None:
    model = _model()
    path = export_onnx(model, tmp_path / "model.onnx")
    assert admit_model(path, DELIVERY.feature_repo, "numeric") == model.inputs
