"""What a training run is asked to do: the model's shape and the loop's hyper-parameters, from YAML.

Batch sizes have one home, this config: the DeepSpeed JSON under ``infra/deepspeed/`` holds the
ZeRO stage, precision and gradient accumulation, and says ``"auto"`` for the micro-batch, which
:func:`deepspeed_config` fills in from here.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: The folder that holds ``infra/`` (the source tree, or site-packages once installed).
LOOPLINE_ROOT = Path(__file__).resolve().parents[1]
#: The placeholder DeepSpeed configs use for a value the trainer fills in.
AUTO = "auto"


class TrainConfig(BaseModel):
    """Hyper-parameters of one training run (the defaults suit the templates' small tabular models)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden: tuple[int, ...] = Field(default=(64, 32), min_length=1, description="Units per hidden ReLU layer.")
    learning_rate: float = Field(default=3e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(default=1e-4, ge=0, description="AdamW decoupled weight decay.")
    epochs: int = Field(default=4, ge=1)
    micro_batch_per_process: int = Field(default=64, ge=1, description="Rows per process per forward pass.")
    seed: int = Field(default=0, description="Seeds the weights and the data order: same seed, same world size, same run.")
    holdout_fraction: float = Field(default=0.2, gt=0, lt=1, description="The latest rows by prediction time, held out.")
    checkpoint_every_steps: int = Field(default=100, ge=1, description="Optimizer steps between checkpoints (and one per epoch).")
    keep_last: int = Field(default=3, ge=1, description="Checkpoints kept; older ones are deleted.")
    ds_config: Path = Field(
        default=Path("infra/deepspeed/zero1.json"),
        description="The DeepSpeed config; a relative path is taken from the Loopline root (the folder holding infra/).",
    )


def load_train_config(path: Path) -> TrainConfig:
    """The config in the YAML file at ``path``; ValueError naming the file and the bad fields."""
    try:
        return TrainConfig.model_validate(yaml.safe_load(Path(path).read_text()) or {})
    except ValidationError as err:
        raise ValueError(f"{path}: not a valid training config (fields: see offline_training/train_config.py)\n{err}") from err


def deepspeed_config(config: TrainConfig) -> dict:
    """The DeepSpeed config dict ``config.ds_config`` names, with the micro-batch filled in from ``config``.

    ValueError when the JSON sets its own micro-batch or a whole-batch size: the YAML config owns them.
    """
    path = config.ds_config if config.ds_config.is_absolute() else LOOPLINE_ROOT / config.ds_config
    ds_config = json.loads(path.read_text())
    if ds_config.get("train_micro_batch_size_per_gpu", AUTO) != AUTO or "train_batch_size" in ds_config:
        raise ValueError(
            f'{path}: set train_micro_batch_size_per_gpu to "auto" and leave train_batch_size out; '
            "the micro-batch is micro_batch_per_process in the training config, and DeepSpeed derives the rest"
        )
    if "optimizer" in ds_config:
        raise ValueError(
            f'{path}: remove the "optimizer" section; the trainer passes torch.optim.AdamW '
            "(a DeepSpeed optimizer JIT-compiles fused Adam, over a minute on a CPU)"
        )
    return {**ds_config, "train_micro_batch_size_per_gpu": config.micro_batch_per_process}
