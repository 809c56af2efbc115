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

from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, TEXT_INPUT_NAME, parse_features_metadata

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
    """One loaded model version: ``predict`` scores a batch of input rows (numbers, and texts when it takes any)."""

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
            raise ImportError(
                f"ONNX Runtime is not installed ({err}) — fix: pip install 'loopline[cpu]', or "
                "'loopline[gpu]' (onnxruntime-gpu) on an NVIDIA host; one of the two, not both"
            ) from err

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
            log.warning(
                "model %s v%s scores on %s although this host appears to have an NVIDIA GPU (nvidia-smi is on PATH): %s",
                name,
                version,
                self.provider,
                why,
            )
        #: The model's inputs in order, with their kinds (see schemas/model_contract.py).
        self.inputs = parse_features_metadata(self._session.get_modelmeta().custom_metadata_map)
        #: Where the numbers and the texts are among the inputs.
        self.numbers = [i for i, spec in enumerate(self.inputs) if spec.kind == "number"]
        self.texts = [i for i, spec in enumerate(self.inputs) if spec.kind == "text"]
        check_inputs(self._session, self.inputs, f"model {name} v{version}")
        self.warm = False
        for size in warmup_batch_sizes:
            self.predict(
                np.zeros((size, len(self.numbers)), dtype=np.float32), np.full((size, len(self.texts)), "", dtype=object)
            )
        self.warm = True

    def predict(self, numbers: np.ndarray, texts: np.ndarray) -> np.ndarray:
        """Scores of a batch, as a ``[batch]`` array: its numeric inputs as a ``[batch, n]`` float32 array, its texts as a
        ``[batch, m]`` array of strings (``m`` may be 0)."""
        feeds = {INPUT_NAME: numbers} if not self.texts else {INPUT_NAME: numbers, TEXT_INPUT_NAME: texts}
        if self.provider == "CUDAExecutionProvider":
            binding = self._session.io_binding()
            for feed, array in feeds.items():
                binding.bind_cpu_input(feed, np.ascontiguousarray(array))
            binding.bind_output(OUTPUT_NAME, "cuda")
            self._session.run_with_iobinding(binding)
            scores = binding.copy_outputs_to_cpu()[0]
        else:
            scores = self._session.run([OUTPUT_NAME], feeds)[0]
        return scores.reshape(len(numbers))


def check_inputs(session, inputs, what: str) -> None:
    """ValueError naming ``what`` unless the ONNX ``session``'s inputs are the contract's for ``inputs``: ``features``
    as wide as the numbers, and ``categories``, as wide as the texts, when there are texts."""
    declared = {i.name: i for i in session.get_inputs()}
    numbers = sum(spec.kind == "number" for spec in inputs)
    texts = len(inputs) - numbers
    if INPUT_NAME not in declared or declared[INPUT_NAME].shape[-1] != numbers:
        raise ValueError(f"{what}: its '{INPUT_NAME}' input must be float32 [batch, {numbers}] (its numeric inputs)")
    if texts and (TEXT_INPUT_NAME not in declared or declared[TEXT_INPUT_NAME].shape[-1] != texts):
        raise ValueError(f"{what}: its '{TEXT_INPUT_NAME}' input must be string [batch, {texts}] (its text inputs)")
