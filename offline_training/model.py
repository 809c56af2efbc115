"""The model Loopline trains: a multi-layer perceptron over a project's inputs, numbers and texts alike.

The network takes the inputs the model contract names (``schemas/model_contract.py``) in their raw form:

* numbers are standardised by a fixed affine layer (the mean and standard deviation of the training split, kept as
  buffers, never trained); a missing value (NaN) becomes 0 after standardising, the training mean, inside the module,
  so torch and ONNX treat it the same;
* texts come as codes of their column's vocabulary (the training split's values, most frequent first; 0 for a value
  the vocabulary does not hold, or none): each column has an embedding. The exported ONNX model looks the codes up
  itself (``offline_training/export.py``), so the scorer feeds raw texts.

The output follows the label's kind: a logit for a binary label (training uses it with a logit loss; the model
returns its probability), a standardised value for a numeric one (the label's training mean and spread are buffers
too; the model returns the value in the label's own units).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from schemas.model_contract import ModelInput

#: The most values a text column's vocabulary keeps (the most frequent); the rest share the unknown code.
MAX_VOCABULARY = 1_000


def vocabulary(values: Sequence[object], limit: int = MAX_VOCABULARY) -> list[str]:
    """A text column's vocabulary from its training values: most frequent first (ties by value), missing and empty
    ones left out, at most ``limit``."""
    counts = Counter(str(v) for v in values if v is not None and v == v and str(v) != "")
    return [value for value, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def encode_texts(texts: np.ndarray, vocabularies: Sequence[Sequence[str]]) -> np.ndarray:
    """``[rows, m]`` texts as their columns' codes: position in the vocabulary plus one, 0 for anything else."""
    codes = np.zeros(texts.shape, dtype=np.int64)
    for column, words in enumerate(vocabularies):
        lookup = {word: i + 1 for i, word in enumerate(words)}
        codes[:, column] = [lookup.get(str(value), 0) for value in texts[:, column]]
    return codes


class TabularMLP(nn.Module):
    """ReLU layers of ``hidden`` units over standardised numbers and embedded texts; ``forward`` gives the raw output
    ``[batch]`` (a logit, or a standardised value), ``predict`` what the exported model returns.

    The weights are drawn from ``seed`` alone (the global torch generator is left as it was), so the same arguments
    build the same network in every process of a run.
    """

    def __init__(
        self,
        inputs: Sequence[ModelInput],
        hidden: Sequence[int],
        mean: Sequence[float],
        std: Sequence[float],
        *,
        vocabularies: Mapping[str, Sequence[str]] | None = None,
        kind: str = "binary",
        target: tuple[float, float] = (0.0, 1.0),
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.inputs = list(inputs)
        self.kind = kind
        numbers = [spec.name for spec in self.inputs if spec.kind == "number"]
        texts = [spec.name for spec in self.inputs if spec.kind == "text"]
        if len(mean) != len(numbers) or len(std) != len(numbers):
            raise ValueError(f"{len(numbers)} numeric inputs but {len(mean)} means and {len(std)} standard deviations")
        vocabularies = vocabularies or {}
        #: Each text input's vocabulary, in the inputs' order.
        self.vocabularies = [list(vocabularies.get(name, ())) for name in texts]
        std_tensor = torch.as_tensor(np.asarray(std, dtype=np.float32))
        self.register_buffer("mean", torch.as_tensor(np.asarray(mean, dtype=np.float32)))
        # A constant (or all-missing) input has no spread to divide by: it passes through centred.
        self.register_buffer("std", torch.where(torch.isfinite(std_tensor) & (std_tensor > 0), std_tensor, 1.0))
        target_std = target[1] if np.isfinite(target[1]) and target[1] > 0 else 1.0
        self.register_buffer("target", torch.tensor([target[0], target_std], dtype=torch.float32))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embeddings = nn.ModuleList(nn.Embedding(len(words) + 1, min(8, len(words) + 1)) for words in self.vocabularies)
            widths = [len(numbers) + sum(e.embedding_dim for e in self.embeddings), *hidden]
            layers: list[nn.Module] = []
            for width_in, width_out in itertools.pairwise(widths):
                layers += [nn.Linear(width_in, width_out), nn.ReLU()]
            layers.append(nn.Linear(widths[-1], 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, numbers: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
        """The raw output ``[batch]`` of raw ``[batch, n]`` numbers and ``[batch, m]`` text codes, computed in the
        numbers' precision: bf16 training feeds bf16 rows to bf16 weights, while the standardisation buffers stay fp32
        (DeepSpeed casts a module's parameters, not its buffers)."""
        parts = [torch.nan_to_num((numbers - self.mean) / self.std, nan=0.0).to(numbers.dtype)]
        for column, embedding in enumerate(self.embeddings):
            parts.append(embedding(codes[:, column]).to(numbers.dtype))
        return self.layers(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]).squeeze(-1)

    def predict(self, numbers: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
        """What the exported model returns ``[batch]``: a probability for a binary label, the value in the label's
        units for a numeric one."""
        raw = self(numbers, codes)
        return torch.sigmoid(raw) if self.kind == "binary" else raw * self.target[1] + self.target[0]

    def loss(self, raw: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of raw outputs against labels: the logit loss (binary) or the squared error of the
        standardised value (numeric)."""
        if self.kind == "binary":
            return nn.functional.binary_cross_entropy_with_logits(raw, labels)
        return nn.functional.mse_loss(raw, ((labels - self.target[0]) / self.target[1]).to(raw.dtype))


def fit_standardisation(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation of ``rows``, ignoring missing values (an all-missing column: 0, 1)."""
    present = ~np.isnan(rows)
    counts = present.sum(axis=0)
    filled = np.where(present, rows, 0.0)
    mean = np.divide(filled.sum(axis=0), counts, out=np.zeros(rows.shape[1]), where=counts > 0)
    squares = np.where(present, (rows - mean) ** 2, 0.0).sum(axis=0)
    std = np.sqrt(np.divide(squares, counts, out=np.ones(rows.shape[1]), where=counts > 0))
    return mean, std


def state_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """A SHA-256 over a state dict's names and tensor bytes: equal fingerprints mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
