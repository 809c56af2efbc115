"""Small scorers written directly as ONNX graphs (no training framework needed).

Deterministic models for the demo, the tests and the benchmarks, over the inputs named in
``schemas/model_contract.py``: a logistic regression ``sigmoid(x·w + b)`` and a multi-layer
perceptron (ReLU hidden layers, sigmoid output) with seeded random weights, heavy enough per row
that batching shows.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from schemas.model_contract import FEATURES_METADATA_KEY, INPUT_NAME, OUTPUT_NAME, features_metadata


def _write(path: Path, inputs: list[str], layers: list[tuple[np.ndarray, np.ndarray]]) -> Path:
    """``sigmoid`` of the dense ``layers`` (ReLU between them) as an ONNX model at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers, current = [], [], INPUT_NAME
    for index, (weights, bias) in enumerate(layers):
        w, b = f"w{index}", f"b{index}"
        initializers += [numpy_helper.from_array(weights.astype(np.float32), w), numpy_helper.from_array(bias.astype(np.float32), b)]
        nodes += [helper.make_node("MatMul", [current, w], [f"mm{index}"]), helper.make_node("Add", [f"mm{index}", b], [f"z{index}"])]
        current = f"z{index}"
        if index < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"h{index}"]))
            current = f"h{index}"
    initializers.append(numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axes"))
    nodes += [helper.make_node("Sigmoid", [current], ["probability"]), helper.make_node("Squeeze", ["probability", "axes"], [OUTPUT_NAME])]
    graph = helper.make_graph(
        nodes,
        "loopline_scorer",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", len(inputs)])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="loopline")
    model.ir_version = 8
    onnx.helper.set_model_props(model, {FEATURES_METADATA_KEY: features_metadata(inputs)})
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_linear_model(path: Path, inputs: list[str], weights: np.ndarray, bias: float) -> Path:
    """Write the ONNX model ``sigmoid(features @ weights + bias)`` to ``path``; return the path."""
    if len(weights) != len(inputs):
        raise ValueError(f"{len(weights)} weights for {len(inputs)} inputs")
    return _write(path, inputs, [(np.asarray(weights).reshape(-1, 1), np.asarray([bias]))])


def write_mlp_model(path: Path, inputs: list[str], hidden: tuple[int, ...] = (256, 256), seed: int = 0) -> Path:
    """Write a multi-layer perceptron with seeded random weights (``hidden`` units per layer) to ``path``."""
    rng = np.random.default_rng(seed)
    sizes = [len(inputs), *hidden, 1]
    layers = [(rng.normal(0, 1 / np.sqrt(n), (n, m)), rng.normal(0, 0.1, m)) for n, m in itertools.pairwise(sizes)]
    return _write(path, inputs, layers)
