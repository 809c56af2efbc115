"""Two measurements of the GPU check (``loopline/scenarios/gpu_check.py``), each in a process of its own so that its
CUDA memory figures start from nothing; each prints one JSON object.

    python -m loopline.scenarios.gpu_probes memory-plan --stage N
    python -m loopline.scenarios.gpu_probes kv-cache --kv-heads K

``memory-plan``: a GPT-style transformer built here (random weights, no download) whose parameters are what ``plan-gpu``
counts for its shape (``ModelShape.transformer``: 12·L·h² + V·h with the embedding tied to the output; biases and norms
aside),
trained a few steps through ``deepspeed.initialize`` in bf16 with ZeRO stage N on one GPU (a one-process world):
the most CUDA memory allocated over those steps against ``training_memory`` for the same shape, precision, stage, GPU
count and micro-batch. DeepSpeed's own estimate of the model states is printed beside it as a reference.

``kv-cache``: a Llama-shaped model from transformers' ``LlamaConfig`` (random weights) generates into a static cache
of known batch and length: the bytes of the cache's tensors and the CUDA memory it added, against ``inference_memory``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket

#: The memory-plan model: ~1.07 B parameters (12·20·2048² + 32000·2048), so its states dominate its activations.
GPT = {"layers": 20, "hidden": 2048, "heads": 16, "vocab": 32000}
MICRO_BATCH, SEQ_LEN, STEPS = 1, 512, 3
#: The KV-cache model: 16 layers of 2048 wide, 16 heads of 128; its cache holds batch × length tokens.
LLAMA = {"layers": 16, "hidden": 2048, "heads": 16, "intermediate": 5632, "vocab": 32000}
KV_BATCH, KV_LENGTH = 8, 4096


def _one_process_world() -> None:
    """The environment torch.distributed reads, for a world of this process alone."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        os.environ.setdefault(name, value)


def _gpt(torch, shape: dict = GPT):
    """The decoder-only transformer of ``shape``: pre-norm blocks of causal self-attention (qkv 3h², out h²) and an MLP
    (8h²), with biases, and an output head tied to the embedding. Every parameter is used through its own module's
    forward: ZeRO 3 gathers a module's parameters when that module runs."""
    nn, functional = torch.nn, torch.nn.functional
    hidden, heads = shape["hidden"], shape["heads"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.mlp_norm = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, heads, hidden // heads).unbind(2)
            attended = functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.out(attended.transpose(1, 2).reshape(batch, length, hidden))
            return x + self.down(functional.gelu(self.up(self.mlp_norm(x))))

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape["vocab"], hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(shape["layers"]))
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, shape["vocab"], bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Gpt()


def memory_plan(stage: int) -> dict:
    """Peak CUDA memory of a few bf16 ZeRO-``stage`` steps of the ``GPT`` model against ``plan-gpu``'s estimate."""
    import deepspeed
    import torch

    from offline_training.gpu_plan import ModelShape, training_memory

    _one_process_world()
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(0)
    with torch.device("cuda"):  # built where it trains: a billion parameters initialise in seconds there
        model = _gpt(torch)
    # Counted before initialize: ZeRO 3 then leaves each parameter an empty placeholder of its partition.
    parameters = sum(p.numel() for p in model.parameters())
    largest_layer = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    # What initialize itself held for a moment (the fp32 model before its bf16 copy) is not training memory.
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, GPT["vocab"], (MICRO_BATCH, SEQ_LEN + 1), device=engine.device)
    for _ in range(STEPS):
        logits = engine(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, GPT["vocab"]), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    shape = ModelShape.transformer(**GPT)
    plan = training_memory(shape, "bf16", stage, 1, MICRO_BATCH, SEQ_LEN)
    return {
        "stage": stage,
        "parameters": parameters,
        "plan_parameters": int(shape.parameters),
        "cuda_peak_allocated_gb": round(peak / 1e9, 3),
        "plan_gb": round(plan.total / 1e9, 3),
        "plan_states_gb": round((plan.total - plan.activations) / 1e9, 3),
        "plan_activations_gb": round(plan.activations / 1e9, 3),
        "deepspeed_estimate_states_gb": deepspeed_estimate(stage, parameters, largest_layer),
        "ratio": round(peak / plan.total, 3),
    }


def deepspeed_estimate(stage: int, parameters: int, largest_layer: int) -> float:
    """DeepSpeed's own estimate of the GPU memory of the model states (its ``estimate_zero*_model_states_mem_needs``:
    ZeRO 1 and 2 share one) for one GPU without offload, in GB. Those functions return (cpu, gpu, ...) bytes."""
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        estimate = estimate_zero3_model_states_mem_needs(
            parameters, largest_layer, 1, 1, cpu_offload=False, cpu_offload_params=False
        )
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        estimate = estimate_zero2_model_states_mem_needs(parameters, 1, 1, cpu_offload=False)
    return round(estimate[1] / 1e9, 3)


def kv_cache(kv_heads: int, device: str = "cuda", llama: dict = LLAMA, batch: int = KV_BATCH, length: int = KV_LENGTH) -> dict:
    """Bytes of a static KV cache of ``batch`` × ``length`` tokens of a ``llama``-shaped model with ``kv_heads``,
    measured (its tensors and, on CUDA, the memory it added) against ``plan-gpu``'s estimate."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    from offline_training.gpu_plan import ModelShape, inference_memory

    config = LlamaConfig(
        hidden_size=llama["hidden"],
        num_hidden_layers=llama["layers"],
        num_attention_heads=llama["heads"],
        num_key_value_heads=kv_heads,
        intermediate_size=llama["intermediate"],
        vocab_size=llama["vocab"],
        max_position_embeddings=length,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, llama["vocab"], (batch, 16), device=device)
    on_cuda = model.device.type == "cuda"
    gc.collect()
    before = _allocated(torch) if on_cuda else 0
    cache = _static_cache(StaticCache, config, model, batch, length)
    # A static cache makes transformers compile the model on CUDA (CUDA graphs, Triton): minutes and a compiler, for
    # a cache whose size does not depend on it. Older releases know no such setting and ignore the attribute.
    model.generation_config.disable_compile = True
    with torch.no_grad():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            past_key_values=cache,
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
        )
    gc.collect()
    added = _allocated(torch) - before if on_cuda else None
    tensors = _cache_bytes(cache)
    shape = ModelShape.transformer(
        layers=llama["layers"],
        hidden=llama["hidden"],
        heads=llama["heads"],
        vocab=llama["vocab"],
        kv_heads=kv_heads,
        intermediate=llama["intermediate"],
        gated_mlp=True,
        tied_embeddings=False,
    )
    _, plan = inference_memory(shape, "bf16", batch, length)
    return {
        "kv_heads": kv_heads,
        "heads": llama["heads"],
        "batch": batch,
        "length": length,
        "cache_tensor_bytes": tensors,
        "cuda_added_bytes": added,
        "plan_bytes": int(plan),
        "tensor_ratio": round(tensors / plan, 4),
        "allocated_ratio": None if added is None else round(added / plan, 4),
    }


def _allocated(torch) -> int:
    """CUDA memory allocated now, once the queued work is done."""
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def _static_cache(static_cache, config, model, batch: int, length: int):
    """A static cache of ``batch`` × ``length`` in the model's dtype and device, through whichever constructor this
    transformers has (its keyword names changed between releases; newer ones size the batch at first use)."""
    import inspect

    accepted = inspect.signature(static_cache.__init__).parameters
    wanted = {
        "config": config,
        "max_cache_len": length,
        "max_batch_size": batch,
        "batch_size": batch,
        "device": model.device,
        "dtype": model.dtype,
    }
    return static_cache(**{name: value for name, value in wanted.items() if name in accepted})


def _cache_bytes(cache) -> int:
    """Bytes of every tensor the cache holds: its layers' keys and values (transformers ≥ 4.54), else its key and value
    lists (earlier); a tensor both name (4.54 and 4.55 keep the lists as views of the layers) counts once."""
    import torch

    layers = getattr(cache, "layers", None) or []
    tensors = [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    if not layers:
        tensors = [*getattr(cache, "key_cache", []), *getattr(cache, "value_cache", [])]
    unique = {t.data_ptr(): t for t in tensors if isinstance(t, torch.Tensor) and t.numel()}
    return sum(t.numel() * t.element_size() for t in unique.values())


def main(argv: list[str] | None = None) -> None:
    """Run one probe (``memory-plan --stage N`` or ``kv-cache --kv-heads K``) and print its JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("memory-plan").add_argument("--stage", type=int, required=True, choices=(1, 2, 3))
    commands.add_parser("kv-cache").add_argument("--kv-heads", type=int, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(memory_plan(args.stage) if args.command == "memory-plan" else kv_cache(args.kv_heads)))


if __name__ == "__main__":
    main()
