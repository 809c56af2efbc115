"""``loopline plan-gpu``: the memory a model shape needs to train and to serve, and the GPUs that fit it."""

from __future__ import annotations

from typing import Annotated

import typer

from loopline.cli import context


def plan_gpu(
    widths: Annotated[str | None, typer.Option(help="An MLP's layer widths, input first: 12,512,512,256,1.")] = None,
    layers: Annotated[int, typer.Option(help="A transformer's layers (with --hidden, --heads, --vocab).")] = 0,
    hidden: Annotated[int, typer.Option(help="A transformer's hidden size.")] = 0,
    heads: Annotated[int, typer.Option(help="A transformer's attention heads.")] = 0,
    vocab: Annotated[int, typer.Option(help="A transformer's vocabulary.")] = 32_000,
    kv_heads: Annotated[
        int | None,
        typer.Option(
            help="Key/value heads (grouped-query attention; 1: multi-query), dividing "
            "--heads; the KV cache shrinks by heads / kv-heads. Default: --heads."
        ),
    ] = None,
    intermediate: Annotated[int | None, typer.Option(help="The MLP's inner width. Default: 4 x --hidden.")] = None,
    gated_mlp: Annotated[bool, typer.Option(help="A gated MLP (SwiGLU, as Llama): three projections, not two.")] = False,
    tied_embeddings: Annotated[
        bool,
        typer.Option(
            "--tied-embeddings/--untied-embeddings",
            help="The LM head shares the embedding matrix (GPT-2) or has its own (Llama).",
        ),
    ] = True,
    precision: Annotated[str, typer.Option(help="Training precision: fp32, bf16 or fp16 (mixed).")] = "bf16",
    serve_precision: Annotated[str, typer.Option(help="Serving precision: fp32, fp16, bf16 or int8.")] = "fp16",
    batch: Annotated[int, typer.Option(help="Training micro-batch per GPU (sequences or rows).")] = 8,
    seq_len: Annotated[int, typer.Option(help="Sequence length (transformers): training and the KV cache.")] = 2048,
    serve_batch: Annotated[int, typer.Option(help="Sequences served at once (KV cache).")] = 16,
    recompute: Annotated[bool, typer.Option(help="Activation checkpointing in training.")] = True,
) -> None:
    """Memory to train (per ZeRO stage) and to serve a model shape, and the fewest GPUs of each type that fit."""
    from loopline.tables import gpu_plan_tables
    from offline_training.gpu_plan import ModelShape

    if widths:
        shape = ModelShape.mlp(tuple(int(w) for w in widths.split(",")))
    elif layers and hidden and heads:
        try:
            shape = ModelShape.transformer(
                layers,
                hidden,
                heads,
                vocab,
                kv_heads=kv_heads,
                intermediate=intermediate,
                gated_mlp=gated_mlp,
                tied_embeddings=tied_embeddings,
            )
        except ValueError as err:
            raise typer.BadParameter(str(err)) from err
    else:
        raise typer.BadParameter("give --widths for an MLP, or --layers, --hidden and --heads for a transformer")
    context.console.print(
        f"{shape.kind}: {shape.parameters / 1e6:,.1f} M parameters; training in {precision} with Adam, micro-batch {batch}"
    )
    memory, fewest, serving = gpu_plan_tables(shape, precision, serve_precision, batch, seq_len, serve_batch, recompute)
    context.console.print(memory, fewest)
    context.console.print(serving)
