"""The GPU check (`infra/gpu_check.sh`): on a machine with an NVIDIA GPU, the parts of the loop that need one.

1. A few DeepSpeed training steps on CUDA: the real trainer (``offline_training/train.py`` under
   torchrun, one process per GPU, ZeRO 1, NCCL) on a small snapshot made here with a planted signal, and the
   most CUDA memory a rank allocated against ``plan-gpu``'s estimate.
2. The trained model scored through ONNX Runtime's CUDA execution provider, as the scorer loads it
   (``online/onnx_runtime.py``): which provider ran, the largest difference from the CPU provider's
   scores, and the latency of a 64-row batch.
3. The vLLM test (``tests/test_vllm_runtime.py``) when its environment (``infra/vllm/setup.sh``) is there.

Each part that cannot run says why in its field. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
INPUTS = ["user_transaction_features:txn_count_5m", "user_transaction_features:amount_sum_1h", "request:amount"]
ROWS = 4_000


def synthetic_snapshot(root: Path, rows: int = ROWS, seed: int = 0) -> Path:
    """A snapshot of ``rows`` examples whose labels depend on all three inputs; its folder."""
    from feedback_loop.snapshots import BASE_COLUMNS, find_snapshot, write_snapshot

    rng = np.random.default_rng(seed)
    count, total, amount = rng.poisson(3, rows), rng.gamma(2, 400, rows), rng.lognormal(4, 1, rows)
    logit = 0.8 * (count - 3) + 0.002 * (total - 800) + 1.5 * (np.log(amount) - 4) - 1.0
    frame = pd.DataFrame({column: None for column in BASE_COLUMNS}, index=range(rows))
    frame["event_id"] = [str(uuid.UUID(int=int(i))) for i in rng.integers(0, 2**63, rows)]
    frame["request_id"], frame["model_name"], frame["model_version"] = frame["event_id"], "fraud", "0"
    frame["score"], frame["defaulted"] = 0.5, 0
    frame["label"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(float)
    frame["predicted_at_ms"] = 1_790_000_000_000 + np.arange(rows) * 1000
    for name, values in zip(INPUTS, (count, total, amount), strict=True):
        frame[name] = values.astype(float)
    manifest = write_snapshot(frame, str(root), kind="synthetic", source={"gpu_check": True}, time_range={"from_ms": None, "to_ms": None})
    return Path(find_snapshot(str(root), manifest.snapshot_id)[1])


def train_on_cuda(snapshot: Path, out: Path, gpus: int) -> dict:
    """Train on ``gpus`` GPUs; the run's metrics (steps, samples/s, holdout AUC) and its peak CUDA memory against
    ``plan-gpu``'s estimate for the same shape, ZeRO stage, GPU count and micro-batch."""
    from offline_training.gpu_plan import ModelShape, training_memory
    from offline_training.launch import launch_training
    from offline_training.train_config import TrainConfig

    config = TrainConfig(hidden=(256, 128), epochs=2, micro_batch_per_process=128, checkpoint_every_steps=20)
    path = out.parent / "gpu_check.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")))  # JSON is YAML
    began = time.perf_counter()
    launch_training(snapshot, path, out, processes=gpus)
    metrics = json.loads((out / "metrics.json").read_text())
    shape = ModelShape.mlp((len(INPUTS), *config.hidden, 1))
    estimate = training_memory(shape, "fp32", 1, gpus, config.micro_batch_per_process).total
    allocated = metrics["memory"].get("cuda_peak_allocated_bytes", 0)
    return {"deepspeed_steps": metrics["global_steps"], "train_samples_per_s": metrics["samples_per_second"],
            "train_holdout_auc": round(metrics["holdout"]["auc"], 4), "train_wall_s": round(time.perf_counter() - began, 1),
            "cuda_peak_allocated_mb": round(allocated / 1e6, 2), "plan_gpu_estimate_mb": round(estimate / 1e6, 2),
            "cuda_memory_vs_plan": round(allocated / estimate, 2)}  # fmt: skip


def score_on_cuda(model_path: Path, snapshot: Path) -> dict:
    """Score the holdout through the scorer's ONNX runtime (CUDA first) and through the CPU provider alone."""
    import onnxruntime as ort

    from offline_training.training_data import load_snapshot
    from online.onnx_runtime import OnnxModel

    rows = load_snapshot(snapshot, 0.2).holdout_x.astype(np.float32)
    served = OnnxModel(model_path, "fraud", "gpu-check")
    cpu = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    expected = cpu.run(None, {cpu.get_inputs()[0].name: rows})[0].reshape(-1)
    difference = float(np.max(np.abs(served.predict(rows) - expected)))
    batch, times = rows[:64], []
    for _ in range(200):
        began = time.perf_counter()
        served.predict(batch)
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    return {"onnx_provider": served.provider, "onnx_max_abs_diff_vs_cpu": difference,
            "onnx_batch64_p50_ms": round(statistics.median(times), 3), "onnx_batch64_p99_ms": round(times[int(0.99 * len(times)) - 1], 3)}  # fmt: skip


def vllm_test() -> str:
    """``passed``/``failed`` of the real-vLLM test, or why it was not run."""
    if not (REPO / ".loopline" / "vllm-env" / "bin" / "vllm").exists():
        return "not run: no vLLM environment (infra/vllm/setup.sh)"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_vllm_runtime.py", "-k", "real"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    return "passed" if done.returncode == 0 else f"failed: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.returncode}"


def main() -> None:
    figures: dict = {}
    try:
        import torch
    except ImportError as err:
        print(json.dumps({"gpu": None, "error": f"torch is not installed ({err}): pip install -e '.[train,gpu]'"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"gpu": None, "error": "no CUDA device visible to torch"}))
        return
    gpus = torch.cuda.device_count()
    figures |= {"gpu": torch.cuda.get_device_name(0), "gpus": gpus, "torch": torch.__version__}
    work = Path(tempfile.mkdtemp(prefix="loopline-gpu-check-"))
    try:
        snapshot = synthetic_snapshot(work / "snapshots")
        for name, part in (("train", lambda: train_on_cuda(snapshot, work / "run", gpus)),
                           ("onnx", lambda: score_on_cuda(work / "run" / "model.onnx", snapshot))):  # fmt: skip
            try:
                figures |= part()
            except Exception as err:  # a part that fails is reported, and the others still run
                figures[f"{name}_error"] = f"{type(err).__name__}: {err}"[-2000:]
        figures["vllm"] = vllm_test()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
