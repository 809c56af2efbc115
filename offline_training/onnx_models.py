"""Small scorers written directly as ONNX graphs (no training framework needed).

Deterministic models for the demo, the tests and the benchmarks, over the inputs named in
``schemas/model_contract.py``: a logistic regression ``sigmoid(x·w + b)`` (or, for a numeric label, the linear
``x·w + b`` itself) and a multi-layer perceptron (ReLU hidden layers, sigmoid output) with seeded random weights,
heavy enough per row that batching shows. They weigh numbers only: a text input is taken (the contract's
``categories``) and weighs nothing, and a missing number (NaN) is taken as 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, TEXT_INPUT_NAME, ModelInput, features_metadata


def _typed(inputs: Sequence[ModelInput | str]) -> list[ModelInput]:
    """Inputs given by name alone are numbers."""
    return [spec if isinstance(spec, ModelInput) else ModelInput(spec) for spec in inputs]


def _write(
    path: Path, inputs: Sequence[ModelInput | str], layers: list[tuple[np.ndarray, np.ndarray]], probability: bool = True
) -> Path:
    """``sigmoid`` of the dense ``layers`` (ReLU between them; the identity instead of the sigmoid without
    ``probability``) over the numeric ``inputs``, as an ONNX model at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    zero = numpy_helper.from_array(np.zeros(1, dtype=np.float32), "zero")
    nodes = [
        helper.make_node("IsNaN", [INPUT_NAME], ["missing"]),
        helper.make_node("Where", ["missing", "zero", INPUT_NAME], ["present"]),
    ]
    initializers, current = [zero], "present"
    for index, (weights, bias) in enumerate(layers):
        w, b = f"w{index}", f"b{index}"
        initializers += [
            numpy_helper.from_array(weights.astype(np.float32), w),
            numpy_helper.from_array(bias.astype(np.float32), b),
        ]
        nodes += [
            helper.make_node("MatMul", [current, w], [f"mm{index}"]),
            helper.make_node("Add", [f"mm{index}", b], [f"z{index}"]),
        ]
        current = f"z{index}"
        if index < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"h{index}"]))
            current = f"h{index}"
    inputs = _typed(inputs)
    numbers, texts = sum(i.kind == "number" for i in inputs), sum(i.kind == "text" for i in inputs)
    initializers.append(numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axes"))
    nodes += [
        helper.make_node("Sigmoid" if probability else "Identity", [current], ["probability"]),
        helper.make_node("Squeeze", ["probability", "axes"], [OUTPUT_NAME]),
    ]
    graph_inputs = [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", numbers])]
    if texts:
        graph_inputs.append(helper.make_tensor_value_info(TEXT_INPUT_NAME, TensorProto.STRING, ["batch", texts]))
    graph = helper.make_graph(
        nodes,
        "loopline_scorer",
        graph_inputs,
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="loopline")
    model.ir_version = 8
    onnx.helper.set_model_props(model, features_metadata(inputs))
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_linear_model(path: Path, inputs: Sequence[ModelInput | str], weights, bias: float, probability: bool = True) -> Path:
    """Write the ONNX model ``sigmoid(numbers @ weights + bias)`` (without ``probability``: ``numbers @ weights +
    bias``) to ``path``; return the path. ``weights``: one per input, 0 for each text."""
    inputs = _typed(inputs)
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) != len(inputs):
        raise ValueError(f"{len(weights)} weights for {len(inputs)} inputs")
    if any(w != 0 for w, spec in zip(weights, inputs, strict=True) if spec.kind == "text"):
        raise ValueError("a linear model weighs numbers only: give each text input weight 0")
    numeric = weights[[spec.kind == "number" for spec in inputs]]
    return _write(path, inputs, [(numeric.reshape(-1, 1), np.asarray([bias]))], probability)


def write_mlp_model(path: Path, inputs: Sequence[ModelInput | str], hidden: tuple[int, ...] = (256, 256), seed: int = 0) -> Path:
    """Write a multi-layer perceptron with seeded random weights (``hidden`` units per layer) over the numeric
    ``inputs`` to ``path``."""
    rng = np.random.default_rng(seed)
    sizes = [sum(spec.kind == "number" for spec in _typed(inputs)), *hidden, 1]
    layers = [(rng.normal(0, 1 / np.sqrt(n), (n, m)), rng.normal(0, 0.1, m)) for n, m in itertools.pairwise(sizes)]
    return _write(path, inputs, layers)
