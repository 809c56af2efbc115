"""Scoring exported model files offline, the way the scorer runs them: ONNX Runtime on the CPU, one intra-op
thread per session, inputs in the order the model's ``loopline.features`` metadata names them.

Evaluation, the comparison with ``prod`` and the quantization check all score through here, so a
candidate and the model it is compared with meet the same runtime and the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from schemas.model_contract import FEATURES_METADATA_KEY, INPUT_NAME, OUTPUT_NAME, parse_features_metadata


class NotComparable(ValueError):
    """A model needs inputs the rows at hand do not have."""


def cpu_session(path: Path):
    """An ONNX Runtime session over the model file at ``path``: CPU provider, one intra-op thread (as a scorer's)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def model_inputs(session) -> list[str]:
    """The inputs a loaded model names in its metadata, in order (ValueError when it names none)."""
    return parse_features_metadata(session.get_modelmeta().custom_metadata_map.get(FEATURES_METADATA_KEY))


def columns_for(inputs: Sequence[str], available: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """The columns of ``rows`` (named ``available``) a model of ``inputs`` takes, in its order, as float32.

    Raises :class:`NotComparable` naming the inputs ``available`` lacks."""
    missing = [name for name in inputs if name not in available]
    if missing:
        raise NotComparable(f"it takes {', '.join(missing)}, which the snapshot does not hold")
    return np.ascontiguousarray(rows[:, [list(available).index(name) for name in inputs]], dtype=np.float32)


def scores(session, rows: np.ndarray) -> np.ndarray:
    """The model's scores of ``[batch, n]`` float32 rows, as ``[batch]``."""
    return session.run([OUTPUT_NAME], {INPUT_NAME: rows})[0].reshape(len(rows))
