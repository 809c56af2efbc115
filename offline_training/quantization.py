"""Dynamic INT8 quantization of an exported model, kept only when it scores the holdout as well as the fp32 model.

ONNX Runtime's ``quantize_dynamic`` stores the weights of the dense layers (Gemm, MatMul) as int8
and quantizes their inputs per batch at run time: no calibration set, and the graph's metadata
(the feature list of the model contract) is carried over. It targets the CPU execution provider;
FP16 for the CUDA provider is not done here.

The quantized file is kept only when its holdout headline metric (AUC for a binary label, RMSE for a
numeric one: ``offline_training/evaluation.Quality``) lies within the declared tolerance of the fp32
model's, either way: one that scores the holdout differently by more than that is not the model that
was evaluated against prod. Both files are timed on the same batches, each repeat running both
back to back in alternating order, so load from other processes on the machine falls on both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from offline_training.evaluation import Quality
from offline_training.onnx_scoring import cpu_session, scores

#: The quantized file, beside the fp32 ``model.onnx``.
QUANTIZED_FILE = "model.int8.onnx"


@dataclass(frozen=True)
class Latency:
    """Time per call of one batch: median and 99th percentile over the repeats, in milliseconds."""

    median_ms: float
    p99_ms: float


@dataclass(frozen=True)
class QuantizationResult:
    """What INT8 did to the holdout metrics and the latency, and whether the quantized file was kept (``path``)."""

    kept: bool
    reason: str
    path: Path | None
    #: The tolerance, in the headline's terms (AUC points, or a relative RMSE change), and that headline.
    max_change: float
    headline: str
    fp32: dict[str, float]
    int8: dict[str, float]
    fp32_latency: Latency
    int8_latency: Latency
    batch_size: int
    repeats: int

    @property
    def change(self) -> float:
        """INT8's holdout headline metric minus fp32's."""
        return self.int8[self.headline] - self.fp32[self.headline]

    @property
    def latency_gain(self) -> float:
        """fp32's median latency over INT8's: above 1, INT8 is faster."""
        return self.fp32_latency.median_ms / self.int8_latency.median_ms


def measure_latency(paths: tuple[Path, Path], rows: pd.DataFrame, batch_size: int, repeats: int) -> tuple[Latency, Latency]:
    """The latency of the two model files at ``paths`` on batches of ``batch_size`` of ``rows`` (the inputs' columns).

    Repeat ``i`` runs batch ``i mod batches`` on both, the first model first on even repeats, second first on odd."""
    sessions = [cpu_session(path) for path in paths]
    batches = [rows.iloc[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    for session in sessions:  # the first run of a shape allocates; it is not what serving sees
        for batch in {len(b): b for b in batches}.values():
            scores(session, batch)
    seconds: list[list[float]] = [[], []]
    for repeat in range(repeats):
        batch = batches[repeat % len(batches)]
        for which in (0, 1) if repeat % 2 == 0 else (1, 0):
            began = time.perf_counter()
            scores(sessions[which], batch)
            seconds[which].append(time.perf_counter() - began)
    first, second = (Latency(float(np.median(s)) * 1000, float(np.percentile(s, 99)) * 1000) for s in seconds)
    return first, second


def quantize_int8(
    model_path: Path,
    rows: pd.DataFrame,
    labels: np.ndarray,
    quality: Quality,
    *,
    max_change: float,
    threshold: float = 0.5,
    batch_size: int = 64,
    repeats: int = 500,
) -> QuantizationResult:
    """Quantize ``model_path`` to ``model.int8.onnx`` beside it and judge it on the holdout ``rows`` (the inputs'
    columns) and ``labels`` by ``quality``'s headline, within ``max_change`` in its terms (AUC points, or a relative
    RMSE change); a refused file is deleted, so only a kept one can be registered."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model_path = Path(model_path)
    quantized = model_path.with_name(QUANTIZED_FILE)
    quantize_dynamic(str(model_path), str(quantized), weight_type=QuantType.QInt8)
    fp32, int8 = (quality.metrics(scores(cpu_session(p), rows), labels, threshold) for p in (model_path, quantized))
    fp32_latency, int8_latency = measure_latency((model_path, quantized), rows, batch_size, repeats)
    headline = quality.headline
    change = abs(quality.shortfall(int8[headline], fp32[headline]))
    described = f"INT8 holdout {quality.describe(int8[headline])} against fp32's {quality.describe(fp32[headline])}"
    kept = bool(change <= max_change)
    if kept:
        reason = f"{described}: within the tolerance {max_change:g} ({change:.5f})"
    else:
        quantized.unlink()
        reason = f"{described}: {change:.5f} apart, more than the tolerance {max_change:g}: the fp32 model is the one registered"
    return QuantizationResult(
        kept,
        reason,
        quantized if kept else None,
        max_change,
        headline,
        fp32,
        int8,
        fp32_latency,
        int8_latency,
        batch_size,
        repeats,
    )
