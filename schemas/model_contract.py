"""How a Loopline model is shaped, so any runtime can serve any registered model.

An ONNX model takes its inputs in two tensors: ``features``, float32 ``[batch, n]``, the numbers among its inputs in
order, and, when some of its inputs are texts (a country, a zone), ``categories``, string ``[batch, m]``, the texts in
order. The model encodes texts itself (a lookup inside the graph), so the scorer feeds raw values. It returns one
float32 tensor ``score`` of shape ``[batch]`` or ``[batch, 1]``: a probability for a binary label, the predicted value
for a numeric one. Its metadata names its inputs: ``loopline.features``, as JSON, every input in order, feature
references (``"view:feature"``, read from the online store) and request fields (``"request:<name>"``, taken from the
score request); ``loopline.input_kinds``, as JSON, ``"number"`` or ``"text"`` for each (absent: all numbers). A
missing number is fed as NaN, a missing text as the empty string.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

INPUT_NAME = "features"
TEXT_INPUT_NAME = "categories"
OUTPUT_NAME = "score"
FEATURES_METADATA_KEY = "loopline.features"
KINDS_METADATA_KEY = "loopline.input_kinds"
REQUEST_PREFIX = "request:"
InputKind = Literal["number", "text"]


@dataclass(frozen=True)
class ModelInput:
    """One input of a model: its name (``view:feature`` or ``request:<field>``) and whether it is a number or a text."""

    name: str
    kind: InputKind = "number"

    @property
    def from_request(self) -> bool:
        """Whether the score request carries it (else the online store)."""
        return self.name.startswith(REQUEST_PREFIX)

    @property
    def request_field(self) -> str:
        """The request field a request input names."""
        return self.name[len(REQUEST_PREFIX) :]


def features_metadata(inputs: Sequence[ModelInput]) -> dict[str, str]:
    """The metadata properties naming a model's inputs, in order, and their kinds."""
    return {FEATURES_METADATA_KEY: json.dumps([i.name for i in inputs]), KINDS_METADATA_KEY: json.dumps([i.kind for i in inputs])}


def parse_features_metadata(metadata: dict[str, str]) -> list[ModelInput]:
    """The inputs a model's metadata names, with their kinds; ValueError when absent or malformed."""
    text = metadata.get(FEATURES_METADATA_KEY)
    if not text:
        raise ValueError(f"the model has no '{FEATURES_METADATA_KEY}' metadata naming its inputs")
    names = json.loads(text)
    if not isinstance(names, list) or not names or not all(isinstance(i, str) and ":" in i for i in names):
        raise ValueError(f"'{FEATURES_METADATA_KEY}' must be a JSON list of 'view:feature' or 'request:<field>' names")
    kinds = json.loads(metadata.get(KINDS_METADATA_KEY) or json.dumps(["number"] * len(names)))
    if not isinstance(kinds, list) or len(kinds) != len(names) or not set(kinds) <= {"number", "text"}:
        raise ValueError(f"'{KINDS_METADATA_KEY}' must be a JSON list of 'number' or 'text', one per input")
    return [ModelInput(name, kind) for name, kind in zip(names, kinds, strict=True)]
