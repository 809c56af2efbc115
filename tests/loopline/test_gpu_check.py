"""The GPU check's CPU side (``loopline/scenarios/gpu_check.py``, ``gpu_probes.py``): on a machine without CUDA it
says so and exits non-zero; a part that raises or misses its threshold fails the check; the KV-cache probe, run here
on the CPU, finds transformers' real static cache exactly as large as ``plan-gpu`` says, with and without
grouped-query attention; the memory-plan probe's model has the parameters ``plan-gpu`` counts for its shape."""

from __future__ import annotations

import json
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from loopline.scenarios import gpu_check
from loopline.scenarios.gpu_check import FAIL, PASS, SKIP, Schedule, run_part, verdict

REPO = Path(__file__).resolve().parents[2]


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: infra/gpu_check.sh would run the whole check")
def test_without_cuda_the_check_says_so_and_exits_non_zero() -> None:
    done = subprocess.run(["bash", "infra/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 2, done.stderr[-2000:]
    assert result["cuda"] is False and result["verdict"] == FAIL
    assert "CUDA" in result["reason"]


def test_a_failed_or_missing_part_fails_the_check_and_a_skipped_one_does_not() -> None:
    assert verdict({"a": {"verdict": PASS}, "b": {"verdict": SKIP}}) == PASS
    assert verdict({"a": {"verdict": PASS}, "b": {"verdict": FAIL}}) == FAIL
    assert verdict({"a": {"verdict": SKIP}}) == FAIL, "a check where nothing ran proves nothing"


def test_a_part_that_raises_fails_with_its_error_and_the_json_still_comes(monkeypatch, capsys) -> None:
    def broken() -> dict:
        raise ModuleNotFoundError("No module named 'deepspeed'")

    failed = run_part("zero", broken)
    assert failed["verdict"] == FAIL and "deepspeed" in failed["error"]

    def check() -> tuple[dict, int]:
        raise ImportError("an import outside every part")

    monkeypatch.setattr(gpu_check, "check", check)
    with pytest.raises(SystemExit) as exited:
        gpu_check.main()
    assert exited.value.code == 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["verdict"] == FAIL and "outside every part" in last["error"]


@pytest.mark.skipif(find_spec("transformers") is None, reason="needs transformers (the test extra)")
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_plan_gpus_kv_cache_is_transformers_static_cache_byte_for_byte(kv_heads: int) -> None:
    from loopline.scenarios.gpu_probes import kv_cache

    tiny = {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 128, "vocab": 100}
    measured = kv_cache(kv_heads, "cpu", tiny, batch=2, length=32)
    # 2 (keys, values) x 2 layers x kv_heads x 16 head dims x 32 tokens x 2 sequences x 2 bytes (bf16)
    assert measured["cache_tensor_bytes"] == 2 * 2 * kv_heads * 16 * 32 * 2 * 2
    assert measured["tensor_ratio"] == 1.0


def test_the_memory_plan_model_has_the_parameters_plan_gpu_counts() -> None:
    import torch

    from loopline.scenarios.gpu_probes import GPT, _gpt
    from offline_training.gpu_plan import ModelShape

    with torch.device("meta"):  # the shape without the 4 GB of weights
        model = _gpt(torch)
    built = sum(p.numel() for p in model.parameters())
    # plan-gpu leaves out biases and norms (13·h per layer, 2·h for the last norm): 0.03 % here.
    assert built == pytest.approx(ModelShape.transformer(**GPT).parameters, rel=1e-3)
    assert built > 1e9
    tiny = _gpt(torch, {"layers": 2, "hidden": 32, "heads": 4, "vocab": 50})
    logits = tiny(torch.randint(0, 50, (2, 8)))
    logits.sum().backward()  # it trains: every parameter gets a gradient, the tied head's through the embedding
    assert logits.shape == (2, 8, 50) and all(p.grad is not None for p in tiny.parameters())


@pytest.mark.parametrize("gpus", [1, 2, 3, 8, 16])
def test_the_resumed_run_stops_between_checkpoints_on_any_gpu_count(gpus: int) -> None:
    schedule = Schedule.for_gpus(gpus)
    assert schedule.stop_after < schedule.steps, "the run must stop before it ends"
    assert schedule.stop_after % schedule.checkpoint_every, "and after its last checkpoint, so resuming replays steps"
    assert schedule.stop_after > schedule.checkpoint_every, "with a checkpoint to resume from"


def test_the_cache_counts_each_tensor_once_whichever_names_it_has() -> None:
    import torch

    from loopline.scenarios.gpu_probes import _cache_bytes

    keys, values = torch.zeros(2, 4, 8, dtype=torch.bfloat16), torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    layer = type("Layer", (), {"keys": keys, "values": values})()
    # transformers 4.54-4.55: the layers and, deprecated, lists of the same tensors
    both = type("Cache", (), {"layers": [layer], "key_cache": [keys], "value_cache": [values]})()
    lists_only = type("Cache", (), {"key_cache": [keys], "value_cache": [values]})()
    assert _cache_bytes(both) == _cache_bytes(lists_only) == 2 * 2 * 4 * 8 * 2


@pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs deepspeed (the train extra)")
def test_deepspeeds_estimate_of_the_model_states_is_read_for_every_stage() -> None:
    from loopline.scenarios.gpu_probes import deepspeed_estimate

    psi = 10**9
    # One GPU without offload: 2Ψ + 18Ψ for ZeRO 1 and 2 (one estimator), 4 × the largest layer + 18Ψ for ZeRO 3.
    assert deepspeed_estimate(1, psi, 10**7) == deepspeed_estimate(2, psi, 10**7) == pytest.approx(20.0)
    assert deepspeed_estimate(3, psi, 10**7) == pytest.approx(18.04)
