"""Export a trained :class:`FraudMLP` to ONNX in the scorer's model contract, and prove it scores as torch does.

The contract (``schemas/model_contract.py``): one float32 input ``features`` ``[batch, n]`` with a
dynamic batch axis, one float32 output ``score`` ``[batch]`` (a probability: the sigmoid is in the
graph), and the metadata property ``loopline.features`` naming the ``n`` inputs in order.

torch's default exporter (``dynamo=True``, through ``torch.export``) is used: the TorchScript one
is deprecated. It needs ``onnxscript``, which the ``train`` extra installs beside the pinned
``onnx==1.22.*``; ``torch.nan_to_num`` exports as IsNaN/IsInf/Where, so missing inputs are handled
in the graph too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from offline_training.model import FraudMLP
from schemas.model_contract import FEATURES_METADATA_KEY, INPUT_NAME, OUTPUT_NAME, features_metadata


class ExportMismatch(ValueError):
    """The exported model's scores differ from torch's by more than the tolerance."""


class _Probability(nn.Module):
    """The exported graph: the model's probabilities, so the sigmoid is inside the ONNX file."""

    def __init__(self, model: FraudMLP) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.predict_proba(features)


def export_onnx(model: FraudMLP, inputs: list[str], path: Path) -> Path:
    """Write ``model`` (on the CPU, float32) as an ONNX file at ``path`` in the model contract; the path."""
    import onnx

    if len(inputs) != model.mean.numel():
        raise ValueError(f"{len(inputs)} input names for a model of {model.mean.numel()} inputs")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Two example rows: torch.export specialises a batch of 1, and the batch axis must stay symbolic.
    example = torch.zeros(2, len(inputs), dtype=torch.float32)
    batch = torch.export.Dim("batch")
    torch.onnx.export(
        _Probability(model).eval(), (example,), str(path), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: batch},), dynamo=True, external_data=False, verbose=False,
    )  # fmt: skip
    # Metadata goes on with onnx's own API, the one onnx_models.py writes the demo models with.
    exported = onnx.load(str(path))
    onnx.helper.set_model_props(exported, {FEATURES_METADATA_KEY: features_metadata(inputs)})
    onnx.checker.check_model(exported)
    onnx.save(exported, str(path))
    return path


def verify_onnx(model: FraudMLP, path: Path, rows: np.ndarray, atol: float = 1e-5) -> float:
    """The largest absolute difference between torch's and ONNX Runtime's scores of ``rows``.

    Raises :class:`ExportMismatch` when it exceeds ``atol`` (or a score is NaN in one and not the other).
    """
    import onnxruntime as ort

    batch = np.ascontiguousarray(rows, dtype=np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_scores = session.run([OUTPUT_NAME], {INPUT_NAME: batch})[0].reshape(len(batch))
    with torch.no_grad():
        torch_scores = model.predict_proba(torch.from_numpy(batch)).numpy()
    difference = float(np.max(np.abs(onnx_scores - torch_scores), initial=0.0))
    if not difference <= atol:
        raise ExportMismatch(
            f"{path}: ONNX Runtime's scores differ from torch's by {difference:.3g} (> {atol:g}) on {len(batch)} rows; "
            "an operator exported differently: compare the graph (onnx.load) with the module"
        )
    return difference
