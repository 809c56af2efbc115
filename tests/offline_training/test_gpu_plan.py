"""GPU sizing against figures published with the methods it implements."""

from __future__ import annotations

import re
from importlib.util import find_spec

import pytest
from typer.testing import CliRunner

from loopline.cli import app
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
    memory = training_memory(shape, "bf16", stage, gpus=64, batch_per_gpu=0, master_gradients=False)
    assert (memory.parameters + memory.gradients + memory.optimizer) / GB == pytest.approx(expected_gb, abs=0.05)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeeds_fp32_gradients_are_counted_as_its_own_estimate_does(stage: int) -> None:
    psi, gpus = 1e9, 8
    memory = training_memory(ModelShape("mlp", psi, widths=(1, 1)), "bf16", stage, gpus=gpus, batch_per_gpu=0)
    paper = training_memory(
        ModelShape("mlp", psi, widths=(1, 1)), "bf16", stage, gpus=gpus, batch_per_gpu=0, master_gradients=False
    )
    # The fp32 copy of the gradients, partitioned as the optimizer state is.
    assert memory.optimizer - paper.optimizer == pytest.approx(4 * psi / (gpus if stage >= 1 else 1))
    if stage == 2 and find_spec("deepspeed") is not None:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        # DeepSpeed's own ZeRO 2 estimator without offload (its figure for the GPU comes second).
        assert memory.total == pytest.approx(estimate_zero2_model_states_mem_needs(int(psi), gpus, 1, cpu_offload=False)[1])
    fp32 = training_memory(ModelShape("mlp", psi, widths=(1, 1)), "fp32", stage, gpus=gpus, batch_per_gpu=0)
    assert fp32 == training_memory(
        ModelShape("mlp", psi, widths=(1, 1)), "fp32", stage, gpus=gpus, batch_per_gpu=0, master_gradients=False
    ), "fp32 training steps on its own gradients"


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
    fit = {
        stage: smallest_training_fit(llama_70b, "bf16", stage, batch_per_gpu=1, seq_len=4096, gpu="H100-80GB", recompute=True)
        for stage in (0, 3)
    }
    assert fit[0] is None, "16 bytes per parameter of a 70 B model never fit one 80 GB GPU without sharding"
    # 64.7 B parameters by 12·L·h² + V·h: 20 bytes each with DeepSpeed's fp32 gradients = 1.29 TB; over 16 GPUs
    # 80.9 GB + 5.4 GB of checkpointed activations is over the 72 GB usable of an 80 GB GPU, over 32 it is 45.8 GB.
    assert fit[3] == 32
    without_recompute = smallest_training_fit(llama_70b, "bf16", 3, batch_per_gpu=1, seq_len=4096, gpu="H100-80GB")
    assert without_recompute is None, "520 GB of activations per GPU without recomputation"
    assert smallest_serving_fit(llama_70b, "fp16", batch=1, max_len=4096, gpu="H100-80GB") == 2
    assert smallest_serving_fit(llama_70b, "fp16", batch=1, max_len=4096, gpu="H200") == 2


# Published shapes (each model's config.json): layers, hidden, heads, kv heads, MLP width, vocab; all gated, untied.
LLAMA_2_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "intermediate": 11008, "vocab": 32000}
LLAMA_2_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "intermediate": 28672, "vocab": 32000}
LLAMA_3_8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336, "vocab": 128256}


@pytest.mark.parametrize(
    ("config", "published_parameters", "kv_bytes_per_token"),
    [
        (LLAMA_2_7B, 6.74e9, 2 * 32 * 32 * 128 * 2),
        (LLAMA_2_70B, 68.98e9, 2 * 80 * 8 * 128 * 2),
        (LLAMA_3_8B, 8.03e9, 2 * 32 * 8 * 128 * 2),
    ],
    ids=["llama-2-7b", "llama-2-70b", "llama-3-8b"],
)
def test_gqa_shapes_match_published_llama_sizes(
    config: dict[str, int], published_parameters: float, kv_bytes_per_token: int
) -> None:
    shape = ModelShape.transformer(**config, gated_mlp=True, tied_embeddings=False)
    assert shape.parameters == pytest.approx(published_parameters, rel=0.01)
    _, kv_cache = inference_memory(shape, "fp16", batch=1, max_len=1)
    assert kv_cache == kv_bytes_per_token


def test_grouped_query_attention_shrinks_the_kv_cache_by_heads_over_kv_heads() -> None:
    config = {**LLAMA_2_70B, "gated_mlp": True, "tied_embeddings": False}
    gqa = ModelShape.transformer(**config)
    mha = ModelShape.transformer(**{**config, "kv_heads": config["heads"]})
    (_, gqa_cache), (_, mha_cache) = (inference_memory(s, "fp16", batch=16, max_len=4096) for s in (gqa, mha))
    assert mha_cache / gqa_cache == 64 / 8
    assert mha.parameters > gqa.parameters, "fewer key/value heads also mean smaller k and v projections"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"heads": 48}, "heads (48) must divide hidden (4096)"),
        ({"kv_heads": 5}, "kv_heads (5) must divide heads (32)"),
        ({"kv_heads": 0}, "kv_heads must be positive, not 0"),
        ({"intermediate": -1}, "intermediate must be positive, not -1"),
        ({"layers": 0}, "layers must be positive, not 0"),
    ],
)
def test_a_shape_attention_cannot_split_is_rejected_by_name(change: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        ModelShape.transformer(**{**LLAMA_3_8B, **change})


def _kv_cache_line(arguments: list[str]) -> str:
    """The serving table's title, where ``plan-gpu`` prints the KV cache."""
    outcome = CliRunner().invoke(app, ["plan-gpu", "--layers", "32", "--hidden", "4096", "--heads", "32", *arguments])
    assert outcome.exit_code == 0, outcome.output
    return next(line.strip() for line in outcome.output.splitlines() if "KV cache" in line)


def test_plan_gpu_kv_heads_shrinks_the_printed_kv_cache() -> None:
    # 16 sequences of 2,048 tokens in fp16: 2 x 32 layers x 32 (or 8) heads x 128 x 2 bytes per token.
    assert _kv_cache_line([]).endswith("KV cache 17.18 GB")
    assert _kv_cache_line(["--kv-heads", "8"]).endswith("KV cache 4.29 GB")


def test_plan_gpu_reports_a_bad_shape_as_a_usage_error() -> None:
    outcome = CliRunner().invoke(app, ["plan-gpu", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "5"])
    assert outcome.exit_code == 2
    assert "kv_heads (5) must divide heads (32)" in outcome.output
