"""Dynamic INT8 quantization of an exported model, kept only when it scores the holdout as well as the fp32 model.

ONNX Runtime's ``quantize_dynamic`` stores the weights of the dense layers (Gemm, MatMul) as int8
and quantizes their inputs per batch at run time: no calibration set, and the graph's metadata
(the feature list of the model contract) is carried over. It targets the CPU execution provider;
FP16 for the CUDA provider is not done here.

The quantized file is kept only when its holdout AUC lies within the declared tolerance of the fp32
model's, either way: one that ranks the holdout differently by more than that is not the model that
was evaluated against prod. Both files are timed on the same batches, each repeat running both
back to back in alternating order, so load from other processes on the machine falls on both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from offline_training.evaluation import classification_metrics
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
    max_auc_change: float
    fp32: dict[str, float]
    int8: dict[str, float]
    fp32_latency: Latency
    int8_latency: Latency
    batch_size: int
    repeats: int

    @property
    def auc_change(self) -> float:
        """INT8's holdout AUC minus fp32's."""
        return self.int8["auc"] - self.fp32["auc"]

    @property
    def latency_gain(self) -> float:
        """fp32's median latency over INT8's: above 1, INT8 is faster."""
        return self.fp32_latency.median_ms / self.int8_latency.median_ms


def measure_latency(paths: tuple[Path, Path], rows: np.ndarray, batch_size: int, repeats: int) -> tuple[Latency, Latency]:
    """The latency of the two model files at ``paths`` on batches of ``batch_size`` of ``rows`` (float32, model order).

    Repeat ``i`` runs batch ``i mod batches`` on both, the first model first on even repeats, second first on odd."""
    sessions = [cpu_session(path) for path in paths]
    batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
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
    model_path: Path, rows: np.ndarray, labels: np.ndarray, *, max_auc_change: float, threshold: float = 0.5,
    batch_size: int = 64, repeats: int = 500,
) -> QuantizationResult:  # fmt: skip
    """Quantize ``model_path`` to ``model.int8.onnx`` beside it and judge it on the holdout ``rows`` (the model's
    inputs in order) and ``labels``; a refused file is deleted, so only a kept one can be registered."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model_path = Path(model_path)
    quantized = model_path.with_name(QUANTIZED_FILE)
    quantize_dynamic(str(model_path), str(quantized), weight_type=QuantType.QInt8)
    batch = np.ascontiguousarray(rows, dtype=np.float32)
    fp32, int8 = (classification_metrics(scores(cpu_session(p), batch), labels, threshold) for p in (model_path, quantized))
    fp32_latency, int8_latency = measure_latency((model_path, quantized), batch, batch_size, repeats)
    change = int8["auc"] - fp32["auc"]
    kept = bool(abs(change) <= max_auc_change)
    if kept:
        reason = f"INT8 holdout AUC {int8['auc']:.4f} is within {max_auc_change:g} of fp32's {fp32['auc']:.4f} ({change:+.5f})"
    else:
        quantized.unlink()
        reason = (f"INT8 holdout AUC {int8['auc']:.4f} differs from fp32's {fp32['auc']:.4f} by {change:+.5f}, more than the "
                  f"tolerance {max_auc_change:g}: the fp32 model is the one registered")  # fmt: skip
    return QuantizationResult(kept, reason, quantized if kept else None, max_auc_change, fp32, int8, fp32_latency, int8_latency,
                              batch_size, repeats)  # fmt: skip
