"""GPU sizing against figures published with the methods it implements."""

from __future__ import annotations

import pytest

from offline_training.gpu_plan import (
    ModelShape,
    inference_memory,
    smallest_serving_fit,
    smallest_training_fit,
    training_memory,
)

GB = 1e9


@pytest.mark.parametrize(("stage", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_the_zero_paper(stage: int, expected_gb: float) -> None:
    # ZeRO (Rajbhandari et al., 2020), Figure 1: 7.5 B parameters, 64 GPUs, mixed precision Adam (K = 12).
    shape = ModelShape("mlp", 7.5e9, widths=(1, 1))
    memory = training_memory(shape, "bf16", stage, gpus=64, batch_per_gpu=0)
    assert (memory.parameters + memory.gradients + memory.optimizer) / GB == pytest.approx(expected_gb, abs=0.05)


def test_transformer_parameters_and_kv_cache_match_known_models() -> None:
    gpt3 = ModelShape.transformer(layers=96, hidden=12288, heads=96, vocab=50257)
    assert gpt3.parameters / 1e9 == pytest.approx(175, rel=0.01)
    llama_7b = ModelShape.transformer(layers=32, hidden=4096, heads=32, vocab=32000)
    weights, kv_cache = inference_memory(llama_7b, "fp16", batch=1, max_len=4096)
    assert weights / GB == pytest.approx(13.0, rel=0.05)
    assert kv_cache / GB == pytest.approx(2.15, rel=0.01)  # 2 x 32 layers x 4096 hidden x 4096 tokens x 2 bytes


def test_an_mlp_counts_weights_and_biases_and_fits_one_small_gpu() -> None:
    mlp = ModelShape.mlp((12, 512, 512, 256, 1))
    assert mlp.parameters == 13 * 512 + 513 * 512 + 513 * 256 + 257
    assert smallest_training_fit(mlp, "fp32", 0, batch_per_gpu=1024, seq_len=1, gpu="T4") == 1


def test_the_fewest_gpus_that_fit_grow_with_the_model_and_shrink_with_zero() -> None:
    llama_70b = ModelShape.transformer(layers=80, hidden=8192, heads=64, vocab=32000)
    fit = {stage: smallest_training_fit(llama_70b, "bf16", stage, batch_per_gpu=1, seq_len=4096, gpu="H100-80GB", recompute=True)
           for stage in (0, 3)}  # fmt: skip
    assert fit[0] is None, "16 bytes per parameter of a 70 B model never fit one 80 GB GPU without sharding"
    # 64.7 B parameters by 12·L·h² + V·h: 16 bytes each = 1.03 TB, over 16 GPUs 64.7 GB, + 5.4 GB of checkpointed
    # activations = 70.1 GB, within the 72 GB usable of an 80 GB GPU.
    assert fit[3] == 16
    without_recompute = smallest_training_fit(llama_70b, "bf16", 3, batch_per_gpu=1, seq_len=4096, gpu="H100-80GB")
    assert without_recompute is None, "520 GB of activations per GPU without recomputation"
    assert smallest_serving_fit(llama_70b, "fp16", batch=1, max_len=4096, gpu="H100-80GB") == 2
    assert smallest_serving_fit(llama_70b, "fp16", batch=1, max_len=4096, gpu="H200") == 2
