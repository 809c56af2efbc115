"""The GPU check (`infra/gpu_check.sh`): on a machine with an NVIDIA GPU, the parts of the loop that need one, each
held to a threshold stated here, before anything was measured. It exits 0 only when every part passes; its last line
is one JSON object with every figure, each part's verdict and the check's.

1. ``zero``: the real trainer and launcher (``offline_training/train.py`` under torchrun, NCCL, one process per GPU),
   bf16, ZeRO stages 1, 2 and 3, one epoch each (250 optimizer steps on one GPU), on a snapshot made here with a planted
   signal. Each run ends, finds the signal (holdout AUC ≥ ``MIN_AUC``; these bf16 runs reached 0.89 rehearsed on a CPU,
   2 processes over gloo) and its ONNX export scores the holdout as torch does (the trainer refuses a difference over 1e-5).
   Each run's CUDA peak is reported beside ``plan-gpu``'s estimate for the MLP, not judged (CUDA's and DeepSpeed's fixed
   buffers dominate a model this small).
2. ``resume``: the ZeRO 3 run stopped a few steps after its third checkpoint (``os._exit``, like a kill) and resumed
   ends with the weights of the uninterrupted ZeRO 3 run, bit for bit.
3. ``memory_plan``: ``torch.cuda.max_memory_allocated`` of a 1.07 B-parameter transformer trained three bf16 steps per
   ZeRO stage in a one-GPU world against ``plan-gpu``'s ``training_memory`` for the same shape
   (``loopline/scenarios/gpu_probes.py``): the ratio within ``MEMORY_TOLERANCE`` of 1. With one GPU the stages'
   formulas agree (nothing is partitioned); what differs between the measurements is DeepSpeed's own buffers. The plan
   leaves out AdamW's temporaries, DeepSpeed's reduce buckets and the fp32 logits, and counts attention scores that
   fused attention does not keep; DeepSpeed's own estimate of the model states is printed beside it.
4. ``kv_cache``: a Llama-shaped model's static cache, with multi-head attention and with grouped-query attention (4 KV
   heads for 16): its tensors' bytes within ``KV_TENSOR_TOLERANCE`` of ``plan-gpu``'s KV estimate, the CUDA memory it
   added within ``KV_ALLOCATED_TOLERANCE``.
5. ``onnx_runtime``: the scorer's runtime (``online/onnx_runtime.py``) scores the CUDA-trained model as ONNX Runtime's
   CPU provider does (within 1e-5), on CUDA when onnxruntime-gpu is installed, else on the CPU with a warning logged
   (the lent machine has the CPU build only: the GPU wheel is too large to carry there; the JSON says which ran).
6. ``vllm``: the real-vLLM test where its environment is (``infra/vllm/setup.sh``); skipped, not failed, elsewhere.

Without CUDA the check says so and exits 2; a part that raises fails with its error, and the others still run.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
#: A probe model's inputs: two features of a made-up view and a request field (rows made in code, no project needed).
INPUTS = ["probe_features:count_5m", "probe_features:sum_1h", "request:value"]
#: 20,000 rows, 16,000 of them trained on in micro-batches of 64 per GPU: 250 optimizer steps an epoch on one GPU.
ROWS, HOLDOUT, MICRO_BATCH, EPOCHS, HIDDEN = 20_000, 0.2, 64, 1, (256, 128)
MIN_AUC = 0.75
MEMORY_TOLERANCE, KV_TENSOR_TOLERANCE, KV_ALLOCATED_TOLERANCE = 0.25, 0.01, 0.10
ONNX_TOLERANCE = 1e-5
PASS, FAIL, SKIP = "pass", "fail", "skipped"


def synthetic_snapshot(root: Path, rows: int = ROWS, seed: int = 0) -> Path:
    """A snapshot of ``rows`` examples whose labels depend on all three inputs; its folder."""
    import pandas as pd

    from feedback_loop.snapshots import BASE_COLUMNS, find_snapshot, write_snapshot

    rng = np.random.default_rng(seed)
    count, total, value = rng.poisson(3, rows), rng.gamma(2, 400, rows), rng.lognormal(4, 1, rows)
    logit = 0.8 * (count - 3) + 0.002 * (total - 800) + 1.5 * (np.log(value) - 4) - 1.0
    frame = pd.DataFrame({column: None for column in BASE_COLUMNS}, index=range(rows))
    frame["event_id"] = [str(uuid.UUID(int=int(i))) for i in rng.integers(0, 2**63, rows)]
    frame["request_id"], frame["model_name"], frame["model_version"] = frame["event_id"], "gpu-check", "0"
    frame["score"], frame["defaulted"] = 0.5, 0
    frame["label"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(float)
    frame["predicted_at_ms"] = 1_790_000_000_000 + np.arange(rows) * 1000
    for name, values in zip(INPUTS, (count, total, value), strict=True):
        frame[name] = values.astype(float)
    manifest = write_snapshot(
        frame, str(root), kind="synthetic", source={"gpu_check": True}, time_range={"from_ms": None, "to_ms": None}
    )
    return Path(find_snapshot(str(root), manifest.snapshot_id)[1])


@dataclass(frozen=True)
class Schedule:
    """The runs' checkpoints and the resume test's stop, from the steps an epoch takes on ``gpus`` GPUs: five
    checkpoints an epoch, the stop a few steps past the third, so resuming replays steps the checkpoint missed."""

    steps: int
    checkpoint_every: int
    stop_after: int

    @classmethod
    def for_gpus(cls, gpus: int, rows: int = ROWS) -> Schedule:
        per_rank = math.ceil(round(rows * (1 - HOLDOUT)) / gpus)  # DistributedSampler pads the ranks to equal shares
        steps = math.ceil(per_rank / MICRO_BATCH) * EPOCHS
        every = max(1, steps // 5)
        return cls(steps, every, 3 * every + max(1, every // 4))


def _bf16_config(work: Path, stage: int, schedule: Schedule) -> Path:
    """A training config for ZeRO ``stage`` in bf16: the stage's DeepSpeed JSON with its bf16 section switched on."""
    from offline_training.train_config import LOOPLINE_ROOT, TrainConfig

    ds_config = json.loads((LOOPLINE_ROOT / "infra" / "deepspeed" / f"zero{stage}.json").read_text())
    ds_config["bf16"] = {"enabled": True}
    ds_path = work / f"zero{stage}_bf16.json"
    ds_path.write_text(json.dumps(ds_config))
    config = TrainConfig(
        hidden=HIDDEN,
        epochs=EPOCHS,
        micro_batch_per_process=MICRO_BATCH,
        holdout_fraction=HOLDOUT,
        checkpoint_every_steps=schedule.checkpoint_every,
        ds_config=ds_path,
    )
    path = work / f"zero{stage}.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")))  # JSON is YAML
    return path


def zero_stages(snapshot: Path, work: Path, gpus: int) -> dict:
    """Train with ZeRO 1, 2 and 3 in bf16 on ``gpus`` GPUs; each run's steps, AUC, ONNX difference and peak memory
    (beside ``plan-gpu``'s estimate for the MLP, reported only)."""
    from offline_training.gpu_plan import ModelShape, training_memory
    from offline_training.launch import launch_training

    figures: dict = {"gpus": gpus}
    verdict = PASS
    shape = ModelShape.mlp((len(INPUTS), *HIDDEN, 1))
    for stage in (1, 2, 3):
        out = work / f"zero{stage}"
        began = time.perf_counter()
        launch_training(snapshot, _bf16_config(work, stage, Schedule.for_gpus(gpus)), out, processes=gpus)
        metrics = json.loads((out / "metrics.json").read_text())
        auc = round(metrics["holdout"]["auc"], 4)
        peak = metrics["memory"].get("cuda_peak_allocated_bytes", 0)
        plan = training_memory(shape, "bf16", stage, gpus, MICRO_BATCH).total
        figures[f"zero{stage}"] = {
            "steps": metrics["global_steps"],
            "holdout_auc": auc,
            "onnx_max_abs_diff": metrics["onnx_max_abs_diff"],
            "samples_per_s": metrics["samples_per_second"],
            "wall_s": round(time.perf_counter() - began, 1),
            "cuda_peak_allocated_mb": round(peak / 1e6, 2),
            "plan_mb": round(plan / 1e6, 3),
        }
        if auc < MIN_AUC or metrics["onnx_max_abs_diff"] > ONNX_TOLERANCE:
            verdict = FAIL
    return {"verdict": verdict, "min_auc": MIN_AUC, **figures}


def resume_identical(snapshot: Path, work: Path, gpus: int) -> dict:
    """The ZeRO 3 run stopped after ``Schedule.stop_after`` steps and resumed, against the uninterrupted run's weights."""
    import torch

    from offline_training.launch import TrainingError, launch_training

    config, full, out, stop = (
        work / "zero3.yaml",
        work / "zero3" / "model.pt",
        work / "zero3-resumed",
        Schedule.for_gpus(gpus).stop_after,
    )
    if not full.exists():
        return {"verdict": FAIL, "reason": "no uninterrupted ZeRO 3 run to compare with (see the zero part)"}
    try:
        launch_training(snapshot, config, out, processes=gpus, extra=["--stop-after-steps", str(stop)])
    except TrainingError:
        pass  # the run exits like a killed one: that is the point
    else:
        return {"verdict": FAIL, "reason": f"the run did not stop after step {stop}"}
    launch_training(snapshot, config, out, processes=gpus, resume=True)
    expected, resumed = torch.load(full, weights_only=True), torch.load(out / "model.pt", weights_only=True)
    different = [name for name in expected if not torch.equal(expected[name], resumed.get(name, torch.empty(0)))]
    return {
        "verdict": PASS if not different and expected.keys() == resumed.keys() else FAIL,
        "stopped_after_step": stop,
        "tensors_compared": len(expected),
        "tensors_different": different,
    }


def _probe(*arguments: str, timeout_s: float = 300) -> dict:
    """One run of ``loopline/scenarios/gpu_probes.py`` (a process of its own: its CUDA figures start from nothing)."""
    done = subprocess.run(
        [sys.executable, "-m", "loopline.scenarios.gpu_probes", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"gpu_probes {' '.join(arguments)} exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return json.loads(lines[-1])


def _probes(command: str, option: str, values: tuple[int, ...], within: Callable[[dict], bool], **thresholds: float) -> dict:
    """``gpu_probes command option value`` for each value, one after another (one probe's memory at a time beside the
    training runs); a pass when every run is ``within`` its thresholds."""
    runs = {f"{option.strip('-').replace('-', '_')}_{value}": _probe(command, option, str(value)) for value in values}
    return {"verdict": PASS if all(within(run) for run in runs.values()) else FAIL, **thresholds, **runs}


def memory_plan() -> dict:
    """Peak CUDA memory per ZeRO stage against ``plan-gpu`` (one GPU)."""
    return _probes(
        "memory-plan", "--stage", (1, 2, 3), lambda run: abs(run["ratio"] - 1) <= MEMORY_TOLERANCE, tolerance=MEMORY_TOLERANCE
    )


def kv_cache() -> dict:
    """A static KV cache's bytes against ``plan-gpu``, with and without grouped-query attention."""
    return _probes(
        "kv-cache",
        "--kv-heads",
        (16, 4),
        lambda run: (
            abs(run["tensor_ratio"] - 1) <= KV_TENSOR_TOLERANCE and abs(run["allocated_ratio"] - 1) <= KV_ALLOCATED_TOLERANCE
        ),
        tensor_tolerance=KV_TENSOR_TOLERANCE,
        allocated_tolerance=KV_ALLOCATED_TOLERANCE,
    )


class _Warnings(logging.Handler):
    """The warnings a logger said while attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def onnx_runtime(model_path: Path, snapshot: Path) -> dict:
    """The CUDA-trained model through the scorer's runtime: the provider it ran on, its scores against the CPU
    provider's, and a 64-row batch's latency."""
    import onnxruntime as ort

    from offline_training.training_data import load_snapshot
    from online.onnx_runtime import OnnxModel

    rows = load_snapshot(snapshot, HOLDOUT).holdout_x.astype(np.float32)
    no_texts = np.zeros((len(rows), 0), dtype=object)
    cuda_installed = "CUDAExecutionProvider" in ort.get_available_providers()
    warnings, logger = _Warnings(), logging.getLogger("online.onnx_runtime")
    logger.addHandler(warnings)
    try:
        served = OnnxModel(model_path, "gpu-check", "1")
    finally:
        logger.removeHandler(warnings)
    cpu = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    expected = cpu.run(None, {cpu.get_inputs()[0].name: rows})[0].reshape(-1)
    difference = float(np.max(np.abs(served.predict(rows, no_texts) - expected)))
    times = []
    for _ in range(200):
        began = time.perf_counter()
        served.predict(rows[:64], no_texts[:64])
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    # With the GPU build the model must run on CUDA; with the CPU build on the CPU, and the fallback said out loud.
    right_provider = (
        served.provider == "CUDAExecutionProvider"
        if cuda_installed
        else served.provider == "CPUExecutionProvider" and bool(warnings.messages)
    )
    return {
        "verdict": PASS if right_provider and difference <= ONNX_TOLERANCE else FAIL,
        "provider": served.provider,
        "cuda_provider_installed": cuda_installed,
        "fallback_warning": warnings.messages[0] if warnings.messages else None,
        "max_abs_diff_vs_cpu": difference,
        "batch64_p50_ms": round(times[len(times) // 2], 3),
        "batch64_p99_ms": round(times[int(0.99 * len(times)) - 1], 3),
    }


def vllm_test() -> dict:
    """The real-vLLM test, or why it was not run."""
    if not (REPO / ".loopline" / "vllm-env" / "bin" / "vllm").exists():
        return {"verdict": SKIP, "reason": "no vLLM environment (infra/vllm/setup.sh)"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/online/test_vllm_runtime.py", "-k", "real"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else str(done.returncode)
    return {"verdict": PASS if done.returncode == 0 else FAIL, "pytest": last}


def run_part(name: str, part: Callable[[], dict]) -> dict:
    """``part()``'s figures and verdict, with its wall time; a part that raises fails with its error."""
    began = time.perf_counter()
    try:
        result = part()
    except Exception as err:  # a part that fails is reported, and the others still run
        result = {"verdict": FAIL, "error": f"{type(err).__name__}: {err}"[-2000:], "trace": traceback.format_exc()[-1500:]}
    print(f"gpu check: {name}: {result['verdict']} ({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    return {**result, "wall_s": round(time.perf_counter() - began, 1)}


def verdict(parts: dict[str, dict]) -> str:
    """The check's verdict: a pass when no part failed (a skipped part is not a failure) and at least one passed."""
    verdicts = [part["verdict"] for part in parts.values()]
    return PASS if FAIL not in verdicts and PASS in verdicts else FAIL


def check() -> tuple[dict, int]:
    """Run every part; (the JSON object, the exit status)."""
    try:
        import torch
    except ImportError as err:
        return {"cuda": False, "verdict": FAIL, "reason": f"torch is not installed ({err}): pip install -e '.[cpu,train]'"}, 2
    if not torch.cuda.is_available():
        return {
            "cuda": False,
            "verdict": FAIL,
            "torch": torch.__version__,
            "reason": "no CUDA device visible to torch: the GPU check needs an NVIDIA GPU",
        }, 2
    gpus = torch.cuda.device_count()
    figures: dict = {
        "cuda": True,
        "gpu": torch.cuda.get_device_name(0),
        "gpus": gpus,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
    }
    work = Path(tempfile.mkdtemp(prefix="loopline-gpu-check-"))
    try:
        snapshot = synthetic_snapshot(work / "snapshots")
        # The probes run in processes of their own (CUDA's peak figures are per process), one at a time, beside the
        # training runs, which need little memory: the check takes the longer of the two, not their sum.
        with ThreadPoolExecutor(1) as probes:
            measured = probes.submit(
                lambda: {name: run_part(name, part) for name, part in (("memory_plan", memory_plan), ("kv_cache", kv_cache))}
            )
            parts = {"zero": run_part("zero", lambda: zero_stages(snapshot, work, gpus))}
            parts["resume"] = run_part("resume", lambda: resume_identical(snapshot, work, gpus))
            parts |= measured.result()
        parts["onnx_runtime"] = run_part("onnx_runtime", lambda: onnx_runtime(work / "zero1" / "model.onnx", snapshot))
        parts["vllm"] = run_part("vllm", vllm_test)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {**figures, "verdict": verdict(parts), "parts": parts}
    return result, 0 if result["verdict"] == PASS else 1


def main() -> None:
    """Run the check; print its JSON object last and exit with its status (0 pass, 1 a part failed, 2 no CUDA)."""
    try:
        result, status = check()
    except Exception as err:  # whatever went wrong, the last line is still the JSON object
        result, status = {"verdict": FAIL, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-2000:]}, 1
    print(json.dumps(result))
    sys.exit(status)


if __name__ == "__main__":
    main()
