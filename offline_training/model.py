"""The fraud scorer as a torch module: a multi-layer perceptron over raw feature rows.

The network takes the inputs the model contract names (``schemas/model_contract.py``) in their raw
units. Standardisation is baked in as a fixed affine layer (mean and standard deviation of the
training split, kept as buffers, never trained), so the exported ONNX model takes raw features
just as the scorer reads them. A missing value (NaN) becomes 0 after standardising, i.e. the
training mean, inside the module, so torch and ONNX treat it the same.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn


class FraudMLP(nn.Module):
    """ReLU layers of ``hidden`` units over standardised ``inputs``; ``forward`` gives logits ``[batch]``.

    The weights are drawn from ``seed`` alone (the global torch generator is left as it was), so the
    same arguments build the same network in every process of a run.
    """

    def __init__(
        self, inputs: Sequence[str], hidden: Sequence[int], mean: Sequence[float], std: Sequence[float], seed: int = 0
    ) -> None:
        super().__init__()
        if len(mean) != len(inputs) or len(std) != len(inputs):
            raise ValueError(f"{len(inputs)} inputs but {len(mean)} means and {len(std)} standard deviations")
        self.inputs = list(inputs)
        std_tensor = torch.as_tensor(np.asarray(std, dtype=np.float32))
        self.register_buffer("mean", torch.as_tensor(np.asarray(mean, dtype=np.float32)))
        # A constant (or all-missing) input has no spread to divide by: it passes through centred.
        self.register_buffer("std", torch.where(torch.isfinite(std_tensor) & (std_tensor > 0), std_tensor, 1.0))
        widths = [len(self.inputs), *hidden]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            layers: list[nn.Module] = []
            for width_in, width_out in itertools.pairwise(widths):
                layers += [nn.Linear(width_in, width_out), nn.ReLU()]
            layers.append(nn.Linear(widths[-1], 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch]`` of raw ``[batch, n]`` rows (training uses them with a logit loss), computed in the rows'
        precision: bf16 training feeds bf16 rows to bf16 weights, while the standardisation buffers stay fp32
        (DeepSpeed casts a module's parameters, not its buffers)."""
        standard = torch.nan_to_num((features - self.mean) / self.std, nan=0.0).to(features.dtype)
        return self.layers(standard).squeeze(-1)

    def predict_proba(self, features: torch.Tensor) -> torch.Tensor:
        """Fraud probabilities ``[batch]`` of raw ``[batch, n]`` rows: what the exported model returns."""
        return torch.sigmoid(self(features))


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
