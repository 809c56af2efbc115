"""Whether a model file may be served for a project: the checks a model trained elsewhere passes before it is
registered, the same a trained one meets by construction.

A model is admitted when ONNX Runtime loads it in the model contract (``schemas/model_contract.py``: its metadata
names its inputs and their kinds, its ``features`` and ``categories`` inputs are as wide as those, it answers a
``score``), every input it names is one the project's Feast repo declares (a view's feature or a request field) with
the same kind (a String is a text, anything else a number), and it scores a batch of empty rows (NaN numbers, empty
texts: what a request with every feature missing and no default feeds) with finite scores, probabilities for a
binary label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from feature_store.model_inputs import typed_inputs
from online.onnx_runtime import OnnxModel
from schemas.model_contract import ModelInput

#: Rows of the empty batch a model must score.
_PROBE_ROWS = 4


class ModelRejected(ValueError):
    """A model file the project cannot serve; the message lists every reason."""


def admit_model(path: Path, repo_path: Path, label_kind: Literal["binary", "numeric"]) -> list[ModelInput]:
    """The inputs of the ONNX model at ``path`` when the project whose Feast repo is ``repo_path`` can serve it for a
    ``label_kind`` label; ModelRejected saying why not."""
    try:
        model = OnnxModel(path, path.name, "candidate", warmup_batch_sizes=())
    except Exception as err:  # ONNX Runtime's own errors, and the contract's ValueErrors, all mean one thing here
        raise ModelRejected(f"{path} is not a model in Loopline's contract: {err}") from err
    problems = []
    try:
        declared = {i.name: i for i in typed_inputs(repo_path, [i.name for i in model.inputs])}
    except ValueError as err:
        problems.append(str(err))
    else:
        problems += [
            f"its input {i.name} is a {i.kind}; the project declares it a {declared[i.name].kind}"
            for i in model.inputs
            if declared[i.name].kind != i.kind
        ]
    numbers = np.full((_PROBE_ROWS, len(model.numbers)), np.nan, dtype=np.float32)
    texts = np.full((_PROBE_ROWS, len(model.texts)), "", dtype=object)
    try:
        scores = model.predict(numbers, texts)
    except Exception as err:
        problems.append(f"it does not score a batch of rows with every input missing: {err}")
    else:
        if not np.isfinite(scores).all():
            problems.append("its scores of rows with every input missing are not all finite (it must handle NaN inputs)")
        elif label_kind == "binary" and not ((scores >= 0) & (scores <= 1)).all():
            problems.append(f"the project's label is binary, and its scores are not probabilities (e.g. {float(scores[0]):g})")
    if problems:
        raise ModelRejected(f"{path} cannot be served for this project: " + "; ".join(problems))
    return list(model.inputs)
