"""A logistic-regression fraud scorer written directly as an ONNX graph (no training framework needed).

Small, deterministic models for the demo, the tests and the benchmarks: ``score = sigmoid(x·w + b)``
over the inputs named in ``schemas/model_contract.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.model_contract import FEATURES_METADATA_KEY, INPUT_NAME, OUTPUT_NAME, features_metadata


def write_linear_model(path: Path, inputs: list[str], weights: np.ndarray, bias: float) -> Path:
    """Write the ONNX model ``sigmoid(features @ weights + bias)`` to ``path``; return the path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if len(weights) != len(inputs):
        raise ValueError(f"{len(weights)} weights for {len(inputs)} inputs")
    w = numpy_helper.from_array(np.asarray(weights, dtype=np.float32).reshape(-1, 1), "w")
    b = numpy_helper.from_array(np.asarray([bias], dtype=np.float32), "b")
    nodes = [
        helper.make_node("MatMul", [INPUT_NAME, "w"], ["logit_raw"]),
        helper.make_node("Add", ["logit_raw", "b"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["probability"]),
        helper.make_node("Squeeze", ["probability", "axes"], [OUTPUT_NAME]),
    ]
    axes = numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "linear_scorer",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", len(inputs)])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=[w, b, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="loopline")
    model.ir_version = 8
    onnx.helper.set_model_props(model, {FEATURES_METADATA_KEY: features_metadata(inputs)})
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
