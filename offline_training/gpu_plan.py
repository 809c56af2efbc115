"""GPU sizing: the memory a model needs to train (per ZeRO stage) and to serve, and which GPUs fit it.

Training memory follows the ZeRO paper (Rajbhandari et al., 2020, section 3): with mixed precision
and Adam, a model of Ψ parameters keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and
KΨ of optimizer state (K = 12: fp32 master weights, momentum and variance). Over N data-parallel
GPUs, ZeRO stage 1 partitions the optimizer state, stage 2 also the gradients, stage 3 also the
parameters:

    stage 0: (2 + 2 + K)Ψ      stage 1: (2 + 2)Ψ + KΨ/N      stage 2: 2Ψ + (2 + K)Ψ/N      stage 3: (2 + 2 + K)Ψ/N

(the paper's example, Ψ = 7.5 B on 64 GPUs: 120, 31.4, 16.6 and 1.9 GB). DeepSpeed's mixed-precision
optimizers also keep an fp32 copy of the gradients they step with, partitioned as the optimizer state
is, so its K is 16 (``training_memory``'s ``master_gradients``). In fp32, parameters and
gradients take 4 bytes each and Adam keeps K = 8 (momentum and variance). Activations come on
top, per GPU: for a transformer layer ``s·b·h·(34 + 5·a·s/h)`` bytes at 16 bits without recomputation,
``2·s·b·h`` with full activation checkpointing (Korthikanti et al., 2022); for an MLP the inputs each
layer keeps for its backward pass.

Serving memory: the parameters at the serving precision, plus for LLMs the KV cache,
``2 × layers × kv_heads × head_dim × max length × bytes × batch`` (keys and values; head_dim = hidden / heads).
With grouped-query attention (GQA, Ainslie et al., 2023) several query heads share one key/value head, so
kv_heads < heads shrinks the cache by heads / kv_heads; multi-query attention is kv_heads = 1, and
kv_heads = heads (multi-head attention) gives ``2 × layers × hidden × ...``. The activation formula above
is the multi-head, 4h-MLP layer's; for GQA or other MLP widths it stays an estimate.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

#: Bytes per value by precision.
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
#: Common data-centre GPUs and their memory in GB (10^9 bytes, as vendors count).
GPUS = {"T4": 16, "L4": 24, "A10G": 24, "A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80, "H200": 141}
#: The share of a GPU's memory a plan may use: CUDA context, allocator fragmentation and buffers take the rest.
USABLE_SHARE = 0.9
GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """A model's size: ``parameters``, and what its activations and KV cache depend on.

    An MLP gives its layer widths (``widths``, input first); a transformer (built by ``transformer``) its
    ``layers``, ``hidden`` size, attention ``heads``, key/value heads (``kv_heads``), MLP width (``intermediate``),
    whether the MLP is gated (``gated_mlp``), whether the LM head shares the embedding (``tied_embeddings``) and
    ``vocab``. ``parameters`` is computed from the shape when not given.
    """

    kind: str
    parameters: float
    widths: tuple[int, ...] = ()
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    kv_heads: int = 0
    intermediate: int = 0
    gated_mlp: bool = False
    tied_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        """The width of one attention head: the hidden size split evenly over the query heads."""
        return self.hidden // self.heads if self.heads else 0

    @classmethod
    def mlp(cls, widths: tuple[int, ...]) -> ModelShape:
        """A dense network with these layer widths (input first, output last)."""
        parameters = sum((a + 1) * b for a, b in itertools.pairwise(widths))
        return cls("mlp", float(parameters), widths=widths)

    @classmethod
    def transformer(
        cls,
        layers: int,
        hidden: int,
        heads: int,
        vocab: int,
        *,
        kv_heads: int | None = None,
        intermediate: int | None = None,
        gated_mlp: bool = False,
        tied_embeddings: bool = True,
    ) -> ModelShape:
        """A decoder-only transformer; ``kv_heads`` defaults to ``heads`` (multi-head attention), ``intermediate``
        to 4·hidden, which with an ungated MLP and tied embeddings is GPT's 12·h² per layer plus V·h.

        Per layer: the q and o projections 2·h², k and v 2·h·kv_heads·head_dim, the MLP 2·h·intermediate (3 when
        gated, as SwiGLU's gate, up and down projections); then the embeddings V·h, twice with a separate LM head.
        Norms and biases are left out: under 0.1 % of a billion-parameter model. Raises ValueError for a shape
        attention cannot split."""
        kv_heads = heads if kv_heads is None else kv_heads
        intermediate = 4 * hidden if intermediate is None else intermediate
        _check_transformer(layers, hidden, heads, vocab, kv_heads, intermediate)
        head_dim = hidden // heads
        attention = 2 * hidden**2 + 2 * hidden * kv_heads * head_dim
        mlp = (3 if gated_mlp else 2) * hidden * intermediate
        embeddings = (1 if tied_embeddings else 2) * vocab * hidden
        return cls(
            "transformer",
            float(layers * (attention + mlp) + embeddings),
            layers=layers,
            hidden=hidden,
            heads=heads,
            vocab=vocab,
            kv_heads=kv_heads,
            intermediate=intermediate,
            gated_mlp=gated_mlp,
            tied_embeddings=tied_embeddings,
        )


def _check_transformer(layers: int, hidden: int, heads: int, vocab: int, kv_heads: int, intermediate: int) -> None:
    """Reject a shape whose attention cannot be split: the heads must share the hidden size evenly, and each key/value
    head must serve the same number of query heads; a zero or negative size would give a meaningless estimate."""
    sizes = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "vocab": vocab,
        "kv_heads": kv_heads,
        "intermediate": intermediate,
    }
    for name, value in sizes.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, not {value}")
    if hidden % heads:
        raise ValueError(f"heads ({heads}) must divide hidden ({hidden})")
    if heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads})")


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per GPU to train: parameters, gradients, optimizer state, activations."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations


def training_memory(
    shape: ModelShape,
    precision: str,
    zero_stage: int,
    gpus: int,
    batch_per_gpu: int,
    seq_len: int = 1,
    recompute: bool = False,
    master_gradients: bool = True,
) -> TrainingMemory:
    """Per-GPU training memory of ``shape`` with Adam, at ``precision`` (mixed for 16-bit), ZeRO ``zero_stage`` over
    ``gpus``; ``recompute``: activation checkpointing (each layer keeps only its input).

    ``master_gradients``: in 16-bit training DeepSpeed steps the optimizer on an fp32 copy of the gradients, 4Ψ
    partitioned as the optimizer state is, which the paper's K = 12 leaves out (DeepSpeed's own
    ``estimate_zero2_model_states_mem_needs`` counts it: 2Ψ + 18Ψ/N at stage 2); False gives the paper's figures."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0 to 3, not {zero_stage}")
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"training precision must be fp32, bf16 or fp16, not {precision}")
    psi = shape.parameters
    weight = PRECISION_BYTES[precision]
    k = 8 if precision == "fp32" else 12 + (4 if master_gradients else 0)
    params, grads, optimizer = weight * psi, weight * psi, k * psi
    if zero_stage >= 1:
        optimizer /= gpus
    if zero_stage >= 2:
        grads /= gpus
    if zero_stage >= 3:
        params /= gpus
    return TrainingMemory(params, grads, optimizer, activation_bytes(shape, precision, batch_per_gpu, seq_len, recompute))


def activation_bytes(shape: ModelShape, precision: str, batch: int, seq_len: int = 1, recompute: bool = False) -> float:
    """Activations kept for the backward pass of one GPU's micro-batch."""
    if shape.kind == "transformer":
        s, b, h, a = seq_len, batch, shape.hidden, shape.heads
        per_layer_16bit = 2 * s * b * h if recompute else s * b * h * (34 + 5 * a * s / h)
        return shape.layers * per_layer_16bit * PRECISION_BYTES[precision] / 2
    # Each layer keeps its input and its pre-activation output for the backward pass.
    return batch * sum(shape.widths[:-1]) * 2 * PRECISION_BYTES[precision]


def inference_memory(shape: ModelShape, precision: str, batch: int = 1, max_len: int = 0) -> tuple[float, float]:
    """(parameter bytes, KV-cache bytes) to serve ``shape`` at ``precision``; the KV cache only for transformers."""
    weight = PRECISION_BYTES[precision]
    # A key and a value vector per layer, key/value head and token: GQA's shared heads are what shrink it.
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * weight
    kv_cache = per_token * max_len * batch if shape.kind == "transformer" else 0.0
    return shape.parameters * weight, kv_cache


def fits(per_gpu: float, gpu: str) -> bool:
    """Whether ``per_gpu`` bytes fit one ``gpu``."""
    return per_gpu <= GPUS[gpu] * GB * USABLE_SHARE


def smallest_training_fit(
    shape: ModelShape,
    precision: str,
    zero_stage: int,
    batch_per_gpu: int,
    seq_len: int,
    gpu: str,
    recompute: bool = False,
    max_gpus: int = 1024,
) -> int | None:
    """The fewest ``gpu`` (a power of two up to ``max_gpus``) that fit the training; None if none do."""
    count = 1
    while count <= max_gpus:
        if fits(training_memory(shape, precision, zero_stage, count, batch_per_gpu, seq_len, recompute).total, gpu):
            return count
        count *= 2
    return None


def smallest_serving_fit(shape: ModelShape, precision: str, batch: int, max_len: int, gpu: str, max_gpus: int = 64) -> int | None:
    """The fewest ``gpu`` (tensor-parallel: memory split evenly) that serve the model; None if none do."""
    total = sum(inference_memory(shape, precision, batch, max_len))
    count = max(1, math.ceil(total / (GPUS[gpu] * GB * USABLE_SHARE)))
    return 1 << (count - 1).bit_length() if count <= max_gpus else None
