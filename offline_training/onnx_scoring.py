"""Scoring exported model files offline, the way the scorer runs them: ONNX Runtime on the CPU, one intra-op
thread per session, inputs taken by the names the model's metadata gives them, numbers and texts as the scorer feeds
them (a missing number NaN, a missing text the empty string).

Evaluation, the comparison with ``prod``, the quantization check and the export check all score through here, so a
candidate and the model it is compared with meet the same runtime and the same rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from offline_training.training_data import numbers_of, texts_of
from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, TEXT_INPUT_NAME, ModelInput, parse_features_metadata


class NotComparable(ValueError):
    """A model needs inputs the rows at hand do not have."""


def cpu_session(path: Path):
    """An ONNX Runtime session over the model file at ``path``: CPU provider, one intra-op thread (as a scorer's)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def model_inputs(session) -> list[ModelInput]:
    """The inputs a loaded model names in its metadata, in order, with their kinds (ValueError when it names none)."""
    return parse_features_metadata(session.get_modelmeta().custom_metadata_map)


def feeds(inputs: list[ModelInput], frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A model's feeds from the columns of ``frame``: its numbers as float32, its texts (when it has any) as strings.
    Raises :class:`NotComparable` naming the inputs ``frame`` lacks."""
    missing = [spec.name for spec in inputs if spec.name not in frame.columns]
    if missing:
        raise NotComparable(f"it takes {', '.join(missing)}, which the snapshot does not hold")
    given = {INPUT_NAME: np.ascontiguousarray(numbers_of(frame, inputs), dtype=np.float32)}
    if any(spec.kind == "text" for spec in inputs):
        given[TEXT_INPUT_NAME] = texts_of(frame, inputs)
    return given


def scores(session, frame: pd.DataFrame) -> np.ndarray:
    """The model's scores of the rows of ``frame`` (columns named as its inputs), as ``[batch]``."""
    return session.run([OUTPUT_NAME], feeds(model_inputs(session), frame))[0].reshape(len(frame))
