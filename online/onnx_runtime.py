"""ONNX Runtime as a model runtime: CUDA first where there is one, else CPU; warm on load.

ONNX Runtime comes with one of two extras: ``cpu`` (``onnxruntime``) or ``gpu`` (``onnxruntime-gpu``,
which brings the CUDA execution provider); both install the same ``onnxruntime`` package, so choose
one. The provider actually in use is reported, and a host that looks like it has an NVIDIA GPU but
scores on the CPU says so in a warning. On CUDA the inputs and outputs are bound once per batch
(IO binding) instead of copied per call.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from schemas.model_contract import FEATURES_METADATA_KEY, INPUT_NAME, OUTPUT_NAME, parse_features_metadata

PREFERRED_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")

log = logging.getLogger(__name__)


#: Where the NVIDIA driver's device nodes appear (``/dev/nvidia0``, ...), in a container too.
DEVICE_DIR = Path("/dev")


def gpu_visible() -> bool:
    """Whether this host looks like it has an NVIDIA GPU for this process, cheaply (no driver call): ``nvidia-smi``
    is on PATH or an ``nvidia<N>`` device node exists (a container may have the device without the tools), and
    ``CUDA_VISIBLE_DEVICES`` does not hide every device (it is unset or not empty)."""
    present = shutil.which("nvidia-smi") is not None or any(DEVICE_DIR.glob("nvidia[0-9]*"))
    return present and os.environ.get("CUDA_VISIBLE_DEVICES") != ""


class OnnxModel:
    """One loaded model version: ``predict`` scores a batch of input rows."""

    def __init__(
        self,
        path: Path,
        name: str,
        version: str,
        warmup_batch_sizes: Sequence[int] = (1, 8, 64),
        intra_op_threads: int = 1,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise ImportError(f"ONNX Runtime is not installed ({err}) — fix: pip install 'loopline[cpu]', or "
                              "'loopline[gpu]' (onnxruntime-gpu) on an NVIDIA host; one of the two, not both") from err

        self.name, self.version = name, version
        options = ort.SessionOptions()
        # One thread per batch: on a small machine the batcher, not intra-op threads, gives the throughput.
        options.intra_op_num_threads = intra_op_threads
        available = set(ort.get_available_providers())
        providers = [p for p in PREFERRED_PROVIDERS if p in available]
        self._session = ort.InferenceSession(str(path), options, providers=providers)
        #: The execution provider serving this model (the first one ONNX Runtime accepted).
        self.provider = self._session.get_providers()[0]
        if self.provider != "CUDAExecutionProvider" and gpu_visible():
            if "CUDAExecutionProvider" in available:
                why = "ONNX Runtime's CUDA provider did not load (are its CUDA and cuDNN libraries on LD_LIBRARY_PATH?)"
            else:
                why = "this ONNX Runtime is the CPU build — fix: install loopline[gpu] (onnxruntime-gpu) instead of loopline[cpu]"
            log.warning("model %s v%s scores on %s although this host appears to have an NVIDIA GPU (nvidia-smi is on PATH): %s",
                        name, version, self.provider, why)  # fmt: skip
        metadata = self._session.get_modelmeta().custom_metadata_map
        #: The model's inputs in order (see schemas/model_contract.py).
        self.inputs = parse_features_metadata(metadata.get(FEATURES_METADATA_KEY))
        shape = self._session.get_inputs()[0].shape
        if shape[-1] != len(self.inputs):
            raise ValueError(f"model {name} v{version}: input width {shape[-1]} but {len(self.inputs)} named inputs")
        self.warm = False
        for size in warmup_batch_sizes:
            self.predict(np.zeros((size, len(self.inputs)), dtype=np.float32))
        self.warm = True

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Scores of a ``[batch, n]`` float32 array, as a ``[batch]`` array."""
        if self.provider == "CUDAExecutionProvider":
            binding = self._session.io_binding()
            binding.bind_cpu_input(INPUT_NAME, np.ascontiguousarray(rows))
            binding.bind_output(OUTPUT_NAME, "cuda")
            self._session.run_with_iobinding(binding)
            scores = binding.copy_outputs_to_cpu()[0]
        else:
            scores = self._session.run([OUTPUT_NAME], {INPUT_NAME: rows})[0]
        return scores.reshape(len(rows))
