"""How a Loopline model is shaped, so any runtime can serve any registered model.

An ONNX model takes one float32 tensor ``features`` of shape ``[batch, n]`` and returns one
float32 tensor ``score`` of shape ``[batch]`` or ``[batch, 1]``. Its metadata property
``loopline.features`` lists, as JSON, the ``n`` inputs in order: feature references
(``"view:feature"``, read from the online store) and request fields (``"request:<name>"``, taken
from the score request). A missing value is fed as NaN.
"""

from __future__ import annotations

import json

INPUT_NAME = "features"
OUTPUT_NAME = "score"
FEATURES_METADATA_KEY = "loopline.features"
REQUEST_PREFIX = "request:"


def features_metadata(inputs: list[str]) -> str:
    """The metadata value naming a model's inputs in order."""
    return json.dumps(inputs)


def parse_features_metadata(text: str | None) -> list[str]:
    """The inputs named by a model's metadata; ValueError when absent or malformed."""
    if not text:
        raise ValueError(f"the model has no '{FEATURES_METADATA_KEY}' metadata naming its inputs")
    inputs = json.loads(text)
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) and ":" in i for i in inputs):
        raise ValueError(f"'{FEATURES_METADATA_KEY}' must be a JSON list of 'view:feature' or 'request:<field>' names")
    return inputs
