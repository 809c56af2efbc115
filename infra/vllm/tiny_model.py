"""Build a tiny Llama-architecture LLM and its tokenizer in a folder vLLM can serve (no hub download).

Runs in the vLLM environment (``infra/vllm/setup.sh``), which has torch, transformers and
tokenizers: ``python infra/vllm/tiny_model.py MODEL_DIR``. The weights are random (seeded): the
model exists to exercise serving (its vocabulary holds digits, '.', '?', 'yes' and 'no', fewer
tokens than the scorer asks log-probabilities for), not to be right.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = ["[UNK]", "[PAD]", "<s>", "</s>"]
WORDS = [*map(str, range(10)), ".", "?", "yes", "no"]


def build(folder: Path) -> None:
    """Write config, safetensors weights and a word-level tokenizer to ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["[PAD]"],
        torch_dtype="float16",
    )
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
