"""Export a trained :class:`TabularMLP` to ONNX in the scorer's model contract, and prove it scores as torch does.

The contract (``schemas/model_contract.py``): a float32 input ``features`` ``[batch, n]`` of the numbers and, when
the model has text inputs, a string input ``categories`` ``[batch, m]`` of the texts, each with a dynamic batch axis;
one float32 output ``score`` ``[batch]`` (a probability for a binary label: the sigmoid is in the graph; the value for
a numeric one); the metadata naming the inputs in order and their kinds.

torch's default exporter (``dynamo=True``, through ``torch.export``) exports the network over numbers and text codes:
the TorchScript one is deprecated. It needs ``onnxscript``, which the ``train`` extra installs beside the pinned
``onnx==1.22.*``; ``torch.nan_to_num`` exports as IsNaN/IsInf/Where, so missing inputs are handled in the graph too.
The texts' lookup is then put in front of it with ONNX's own ``LabelEncoder`` (the ``ai.onnx.ml`` domain, which
ONNX Runtime runs on every provider): one per text column, its vocabulary to codes, anything else to 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from offline_training.model import TabularMLP, encode_texts
from offline_training.training_data import numbers_of, texts_of
from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, TEXT_INPUT_NAME, features_metadata

#: The exported network's input of text codes, before the lookup is put in front of it.
_CODES = "codes"


class ExportMismatch(ValueError):
    """The exported model's scores differ from torch's by more than the tolerance."""


class _Prediction(nn.Module):
    """The exported network: the model's prediction (probability or value), so the last step is inside the ONNX file."""

    def __init__(self, model: TabularMLP) -> None:
        super().__init__()
        self.model = model

    def forward(self, numbers: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.predict(numbers, codes)


def export_onnx(model: TabularMLP, path: Path) -> Path:
    """Write ``model`` (on the CPU, float32) as an ONNX file at ``path`` in the model contract; the path."""
    import onnx

    numbers = sum(spec.kind == "number" for spec in model.inputs)
    texts = len(model.vocabularies)
    if numbers == 0:
        raise ValueError("the model contract takes at least one number (its 'features' input): give the model a numeric input")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Two example rows: torch.export specialises a batch of 1, and the batch axis must stay symbolic.
    example = (torch.zeros(2, numbers, dtype=torch.float32), *([torch.zeros(2, texts, dtype=torch.int64)] if texts else []))
    batch = torch.export.Dim("batch")
    torch.onnx.export(
        _Prediction(model).eval(),
        example,
        str(path),
        input_names=[INPUT_NAME, *([_CODES] if texts else [])],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=tuple({0: batch} for _ in example),
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    exported = onnx.load(str(path))
    if texts:
        _look_texts_up(exported, model.vocabularies)
    # Metadata goes on with onnx's own API, the one onnx_models.py writes the demo models with.
    onnx.helper.set_model_props(exported, features_metadata(model.inputs))
    onnx.checker.check_model(exported)
    onnx.save(exported, str(path))
    return path


def _look_texts_up(exported, vocabularies: list[list[str]]) -> None:
    """Put the texts' lookup in front of the exported network: a string input ``categories`` whose column j goes
    through a LabelEncoder of vocabulary j (codes 1.., anything else 0), the columns side by side as its codes."""
    from onnx import TensorProto, helper, numpy_helper

    graph = exported.graph
    codes_input = next(i for i in graph.input if i.name == _CODES)
    graph.input.remove(codes_input)
    graph.input.append(helper.make_tensor_value_info(TEXT_INPUT_NAME, TensorProto.STRING, ["batch", len(vocabularies)]))
    nodes = []
    for column, words in enumerate(vocabularies):
        index = f"text_column_{column}"
        graph.initializer.append(numpy_helper.from_array(np.asarray(column, dtype=np.int64), index))
        nodes += [
            helper.make_node("Gather", [TEXT_INPUT_NAME, index], [f"{index}_text"], axis=1),
            helper.make_node(
                "LabelEncoder",
                [f"{index}_text"],
                [f"{index}_code"],
                domain="ai.onnx.ml",
                keys_strings=words or [""],
                values_int64s=list(range(1, len(words) + 1)) or [0],
                default_int64=0,
            ),
            helper.make_node("Unsqueeze", [f"{index}_code", "text_axis"], [f"{index}_codes"]),
        ]
    graph.initializer.append(numpy_helper.from_array(np.asarray([1], dtype=np.int64), "text_axis"))
    nodes.append(helper.make_node("Concat", [f"text_column_{c}_codes" for c in range(len(vocabularies))], [_CODES], axis=1))
    for node in reversed(nodes):
        graph.node.insert(0, node)
    if not any(opset.domain == "ai.onnx.ml" for opset in exported.opset_import):
        exported.opset_import.append(helper.make_opsetid("ai.onnx.ml", 2))


def torch_scores(model: TabularMLP, frame: pd.DataFrame) -> np.ndarray:
    """What ``model`` predicts for the rows of ``frame`` (its inputs' columns), through torch: texts encoded by the
    model's vocabularies, as the exported lookup does."""
    numbers = torch.from_numpy(numbers_of(frame, model.inputs).astype(np.float32))
    codes = torch.from_numpy(encode_texts(texts_of(frame, model.inputs), model.vocabularies)) if model.vocabularies else None
    with torch.no_grad():
        return model.predict(numbers, codes).numpy()


def verify_onnx(model: TabularMLP, path: Path, frame: pd.DataFrame, atol: float = 1e-5) -> float:
    """The largest absolute difference between torch's and ONNX Runtime's scores of the rows of ``frame``, relative
    to the scores' own size for a numeric label (a value of hundreds is not compared to 1e-5 absolutely).

    Raises :class:`ExportMismatch` when it exceeds ``atol`` (or a score is NaN in one and not the other).
    """
    from offline_training.onnx_scoring import cpu_session, scores

    onnx_scores = scores(cpu_session(path), frame)
    expected = torch_scores(model, frame)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0))) if model.kind == "numeric" else 1.0
    difference = float(np.max(np.abs(onnx_scores - expected), initial=0.0)) / scale
    if not difference <= atol:
        raise ExportMismatch(
            f"{path}: ONNX Runtime's scores differ from torch's by {difference:.3g} (> {atol:g}) on {len(frame)} rows; "
            "an operator exported differently: compare the graph (onnx.load) with the module"
        )
    return difference
