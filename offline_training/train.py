"""The training process, one per data-parallel rank, started by torchrun or the deepspeed launcher.

    python -m offline_training.train --snapshot DIR|URL --config YAML --out DIR [--resume [--universal]]
        [--tracking-uri URI] [--stop-after-steps N]

Each process trains :class:`TabularMLP` on its share of a feedback snapshot's labelled rows through
``deepspeed.initialize`` (ZeRO stage and precision from the DeepSpeed JSON the config names, and a
``torch.optim.AdamW``: a DeepSpeed-config optimizer would JIT-compile fused Adam first). The JSONs
under ``infra/deepspeed/`` train in fp32: their ``bf16`` section is there to switch on on GPUs that
have bf16 units; CPUs train fp32.

Guarantees:

* Reproducible: the same snapshot, config, seed and world size give bit-identical weights. The
  weights are seeded, the data order is ``DistributedSampler(seed)`` with ``set_epoch`` each epoch,
  the rows are sorted by (prediction time, event id) whatever order the files list them in, and
  torch runs its deterministic algorithms.
* Resumable: a checkpoint is saved every ``checkpoint_every_steps`` optimizer steps and at each
  epoch's end (the last ``keep_last`` kept); ``--resume`` loads the newest and goes on from the next
  step, skipping the rows of the epoch already trained on, so a killed and resumed run ends with the
  weights of an uninterrupted one. Every checkpoint carries ``universal_checkpoint_info``, so
  ``offline_training.launch.convert_to_universal`` can make it loadable on another world size
  (``--universal``). A worker torchrun restarts (``--max-restarts``) resumes by itself.
* One run over many nodes: every rank reads the same snapshot (a path or fsspec URL) and writes into
  the same ``--out`` (a volume every node mounts); ``latest`` names a checkpoint only once every rank
  has written its part of it.
* Evaluated on time: the latest ``holdout_fraction`` of labelled rows by prediction time never
  trains; each epoch reports its metrics by the label's kind (AUC, log loss and Brier score for a binary label;
  RMSE, MAE and R² for a numeric one).

Rank 0 shows a progress bar, tracks the run in MLflow with ``--tracking-uri`` (parameters, per-epoch
metrics, snapshot id, code version; a resumed run continues its MLflow run) and at the end writes
``model.pt`` (the state dict), ``model.onnx`` (checked against torch on the holdout rows) and
``metrics.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import deepspeed
import numpy as np
import torch
from deepspeed import comm as dist
from deepspeed.checkpoint.constants import (
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
)
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from tqdm import tqdm

from offline_training.evaluation import Quality
from offline_training.export import export_onnx, torch_scores, verify_onnx
from offline_training.launch import CHECKPOINTS, CUBLAS_WORKSPACE_CONFIG, LATEST, checkpoint_world_size, latest_tag
from offline_training.model import TabularMLP, encode_texts, fit_standardisation, state_fingerprint, vocabulary
from offline_training.train_config import LOOPLINE_ROOT, TrainConfig, deepspeed_config, load_train_config
from offline_training.training_data import Snapshot, load_snapshot, texts_of

log = logging.getLogger(__name__)
#: The MLflow experiment training runs are tracked in (registered versions live in ``loopline-models``).
EXPERIMENT = "loopline-training"
#: Checkpoint folders: ``step<global step>``, and ``step<n>_universal`` for converted ones.
CHECKPOINT_TAG = re.compile(r"step(\d+)(?:_universal)?")


def code_version() -> str:
    """The git commit of the code training runs, or "unknown" outside a git checkout."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=LOOPLINE_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


class Tracking:
    """The run's MLflow record (rank 0, with a tracking URI); every method does nothing without one."""

    def __init__(self, tracking_uri: str | None) -> None:
        self.client, self.run_id = None, None
        if tracking_uri:
            from mlflow import MlflowClient

            self.client = MlflowClient(tracking_uri=tracking_uri)

    def start(self, run_id: str | None, params: dict, tags: dict[str, str]) -> None:
        """Continue the run ``run_id`` (a resumed training) or create one with ``params`` and ``tags``."""
        if self.client is None:
            return
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        self.run_id = self.client.create_run(experiment_id, tags=tags).info.run_id
        for key, value in params.items():
            self.client.log_param(self.run_id, key, value)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is not None:
            for key, value in metrics.items():
                self.client.log_metric(self.run_id, key, value, step=step)

    def finish(self, metrics: dict[str, float]) -> None:
        if self.client is not None:
            self.log(metrics, step=0)
            self.client.set_terminated(self.run_id)


@dataclass(frozen=True)
class Position:
    """Where training stands: in ``epoch``, after ``rows_done`` rows of its shuffled order (all ranks together)."""

    epoch: int = 0
    rows_done: int = 0


def _prune(checkpoints: Path, keep_last: int) -> None:
    """Delete checkpoint folders (and their universal conversions) older than the last ``keep_last`` steps."""
    tags = {
        path: int(m.group(1)) for path in checkpoints.iterdir() if path.is_dir() and (m := CHECKPOINT_TAG.fullmatch(path.name))
    }
    kept = set(sorted(set(tags.values()))[-keep_last:])
    for path, step in tags.items():
        if step not in kept:
            shutil.rmtree(path, ignore_errors=True)


def _all_reduce(values: torch.Tensor, device: torch.device, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``values`` reduced over the ranks, through the engine's device (NCCL reduces only CUDA tensors)."""
    on_device = values.to(device)
    dist.all_reduce(on_device, op=op)
    return on_device.cpu()


def _fold(loss: torch.Tensor, device: torch.device) -> torch.Tensor:
    """All ranks' (loss sum, rows) added up on rank 0, zero elsewhere: the total survives a checkpoint,
    which keeps rank 0's client state."""
    total = _all_reduce(loss, device)
    return total if dist.get_rank() == 0 else torch.zeros_like(loss)


def _resume(engine, checkpoints: Path, universal: bool, snapshot_id: str) -> dict:
    """Load the newest checkpoint (its universal conversion with ``universal``) into ``engine``; its client state."""
    written_by, world = checkpoint_world_size(checkpoints), dist.get_world_size()
    if not universal and written_by not in (None, world):
        raise SystemExit(
            f"the checkpoint in {checkpoints} was written by {written_by} processes and this run has {world}: resume "
            "through offline_training.launch.launch_training (it converts), or run convert_to_universal() and add --universal"
        )
    load_path, client = engine.load_checkpoint(str(checkpoints))
    if load_path is None:
        raise SystemExit(f"no checkpoint could be loaded from {checkpoints}: start without --resume")
    if client["snapshot_id"] != snapshot_id:
        raise SystemExit(
            f"{load_path} trained on snapshot {client['snapshot_id']}, not {snapshot_id}: "
            "resume with that snapshot or use a new --out"
        )
    log.info(
        "resumed from checkpoint %s (written by %d processes) at global step %d, epoch %d, row %d of the epoch; "
        "weights sha256 %s",
        latest_tag(checkpoints, universal),
        client["world_size"],
        engine.global_steps,
        client["epoch"],
        client["rows_in_epoch"],
        state_fingerprint(engine.module.state_dict()),
    )
    return client


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", required=True, help="the snapshot folder (manifest.json + data/): a path or an fsspec URL")
    parser.add_argument("--config", type=Path, required=True, help="the training config (YAML)")
    parser.add_argument("--out", type=Path, required=True, help="checkpoints, model.pt, model.onnx and metrics.json go here")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument(
        "--universal", action="store_true", help="with --resume: load its universal conversion (another world size)"
    )
    parser.add_argument("--tracking-uri", help="the MLflow tracking URI (default: no tracking)")
    parser.add_argument("--stop-after-steps", type=int, help="for tests: exit like a kill after this global step")
    args = parser.parse_args(argv)
    if args.universal and not args.resume:
        parser.error("--universal loads a checkpoint: add --resume")
    return args


def _resume_when_restarted(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments of a worker torchrun restarted (``--max-restarts``: a process or a node failed, or a node joined):
    resume from the newest checkpoint the nodes share, as ``--resume`` would, unless the run failed before its first;
    through its universal conversion only if that checkpoint was written by another world size (a resumed run that
    had not saved yet: the launcher converted it)."""
    checkpoints = args.out / CHECKPOINTS
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 or not (checkpoints / LATEST).is_file():
        return args
    universal = checkpoint_world_size(checkpoints) not in (None, int(os.environ["WORLD_SIZE"]))
    return argparse.Namespace(**{**vars(args), "resume": True, "universal": universal})


def build_model(snapshot: Snapshot, config: TrainConfig) -> TabularMLP:
    """A freshly seeded model of the snapshot's inputs: numbers standardised, texts' vocabularies and a numeric
    label's scale from the training split (so every rank, and the export after training, builds the same one)."""
    mean, std = fit_standardisation(snapshot.train_x)
    texts = [spec.name for spec in snapshot.inputs if spec.kind == "text"]
    vocabularies = {name: vocabulary(snapshot.train[name].tolist()) for name in texts}
    target = (
        (float(np.mean(snapshot.train_y)), float(np.std(snapshot.train_y))) if snapshot.label_kind == "numeric" else (0.0, 1.0)
    )
    return TabularMLP(
        snapshot.inputs,
        config.hidden,
        mean,
        std,
        vocabularies=vocabularies,
        kind=snapshot.label_kind,
        target=target,
        seed=config.seed,
    )


def _engine(snapshot: Snapshot, config: TrainConfig, universal: bool):
    """The DeepSpeed engine over a freshly seeded model, standardised on the training split."""
    torch.manual_seed(config.seed)
    # On CUDA, deterministic mode raises at the first cuBLAS matmul unless cuBLAS has a fixed workspace, which it reads
    # from the environment at its first call. The launcher sets it for its workers; this covers a process started
    # otherwise (the deepspeed launcher, by hand). Nothing before this point has called cuBLAS.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every torch.empty with NaN; ZeRO allocates its (large) gradient buckets
    # that way each step, which made a step ~400x slower. Nothing reads those buffers before writing them.
    torch.utils.deterministic.fill_uninitialized_memory = False
    model = build_model(snapshot, config)
    ds_config = deepspeed_config(config)
    if universal:
        ds_config["checkpoint"] = {**ds_config.get("checkpoint", {}), "load_universal": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    return engine


def _resident_bytes() -> int:
    """This process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _training_memory(before_model: int, device: torch.device) -> dict[str, int]:
    """The most any rank's resident memory grew from before the model was built to its peak while training, the
    peak itself and, on GPUs, the most CUDA memory a rank allocated: the figures to hold against ``plan-gpu``."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    ranks = _all_reduce(torch.tensor([peak - before_model, peak, cuda], dtype=torch.int64), device, dist.ReduceOp.MAX)
    return {"training_bytes": int(ranks[0]), "peak_rss_bytes": int(ranks[1])} | (
        {"cuda_peak_allocated_bytes": int(ranks[2])} if cuda else {}
    )


def _save(engine, checkpoints: Path, keep_last: int, client_state: dict) -> None:
    """Checkpoint every rank's state as ``step<global step>``; rank 0 then points ``latest`` at it and drops checkpoints
    beyond ``keep_last``. ``latest`` names only checkpoints every rank finished writing."""
    # What ds_to_universal needs to rebuild unpartitioned tensors (a plain data-parallel model: no patterns).
    universal = {UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}
    tag = f"step{engine.global_steps}"
    # DeepSpeed's rank 0 writes `latest` once its own files are saved, whatever the other ranks' are doing: a node
    # lost then would leave `latest` naming a checkpoint without its shards.
    engine.save_checkpoint(str(checkpoints), tag=tag, client_state={**client_state, **universal}, save_latest=False)
    dist.barrier()  # every rank's shards are on disk before `latest` names them and older ones go
    if dist.get_rank() == 0:
        pending = checkpoints / f"{LATEST}.tmp"
        pending.write_text(tag)
        pending.replace(checkpoints / LATEST)  # atomic: a resume reads the old tag or the new one
        _prune(checkpoints, keep_last)


def train(args: argparse.Namespace, config: TrainConfig) -> None:
    """Run (or resume) the training loop, then write the model and its metrics (rank 0)."""
    snapshot = load_snapshot(args.snapshot, config.holdout_fraction)
    before_model = _resident_bytes()
    engine = _engine(snapshot, config, args.universal)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = next(engine.module.parameters()).dtype  # bf16 when the DeepSpeed config turns it on
    model: TabularMLP = engine.module
    quality = Quality(snapshot.label_kind)
    train_x, train_y = (torch.from_numpy(a.astype(np.float32)) for a in (snapshot.train_x, snapshot.train_y))
    train_codes = torch.from_numpy(encode_texts(texts_of(snapshot.train, snapshot.inputs), model.vocabularies))
    sampler = DistributedSampler(TensorDataset(train_x, train_codes, train_y), num_replicas=world, rank=rank, seed=config.seed)
    loader = DataLoader(sampler.dataset, batch_size=config.micro_batch_per_process, sampler=sampler)
    accumulation = engine.gradient_accumulation_steps()
    # An epoch ends on an optimizer step, so epoch-end checkpoints never hold half-accumulated gradients.
    batches = len(loader) // accumulation * accumulation
    rows_per_batch = config.micro_batch_per_process * world
    if batches == 0:
        raise SystemExit(f"{len(train_y)} training rows make no optimizer step: lower micro_batch_per_process or the processes")

    checkpoints = args.out / CHECKPOINTS
    tracking = Tracking(args.tracking_uri if rank == 0 else None)
    position, loss = Position(), torch.zeros(2, dtype=torch.float64)  # loss: (sum over rows, rows) this epoch
    client: dict = {}
    if args.resume:
        client = _resume(engine, checkpoints, args.universal, snapshot.snapshot_id)
        position = Position(client["epoch"], client["rows_in_epoch"])
        if rank == 0:
            loss = torch.tensor(client["epoch_loss"], dtype=torch.float64)
    tracking.start(
        client.get("mlflow_run_id"),
        params={
            **config.model_dump(mode="json"),
            "zero_stage": engine.zero_optimization_stage(),
            "world_size": world,
            "train_rows": len(train_y),
            "holdout_rows": len(snapshot.holdout_y),
        },
        tags={"loopline.snapshot_id": snapshot.snapshot_id, "loopline.code_version": code_version()},
    )

    def client_state(after: Position) -> dict:
        """What resuming needs beyond DeepSpeed's own state: where the run stands after this step."""
        return {
            "epoch": after.epoch,
            "step_in_epoch": after.rows_done // rows_per_batch,
            "rows_in_epoch": after.rows_done,
            "global_step": engine.global_steps,
            "world_size": world,
            "snapshot_id": snapshot.snapshot_id,
            "epoch_loss": loss.tolist(),
            "mlflow_run_id": tracking.run_id,
        }

    # On another world size a batch holds another number of rows: resume at the last whole batch
    # (the few rows of a partial one train again), on an optimizer-step boundary.
    skip = position.rows_done // rows_per_batch // accumulation * accumulation
    remaining = (batches - skip) // accumulation + max(config.epochs - position.epoch - 1, 0) * (batches // accumulation)
    bar = tqdm(
        total=engine.global_steps + remaining,
        initial=engine.global_steps,
        disable=rank != 0,
        unit="step",
        desc=f"train {snapshot.snapshot_id}",
        mininterval=1.0,
    )
    holdout = torch.from_numpy(snapshot.holdout_x.astype(np.float32)).to(engine.device, dtype)
    holdout_codes = torch.from_numpy(encode_texts(texts_of(snapshot.holdout, snapshot.inputs), model.vocabularies)).to(
        engine.device
    )
    started, rows_trained = time.perf_counter(), 0
    for epoch in range(position.epoch, config.epochs):
        sampler.set_epoch(epoch)
        first = skip if epoch == position.epoch else 0
        for index, (x, codes, y) in enumerate(islice(loader, first, batches), start=first):
            raw = engine(x.to(engine.device, dtype), codes.to(engine.device))
            batch_loss = model.loss(raw, y.to(engine.device, dtype))
            engine.backward(batch_loss)
            engine.step()
            loss += torch.tensor([batch_loss.item() * len(x), len(x)], dtype=torch.float64)
            rows_trained += len(x)
            if (index + 1) % accumulation:
                continue
            bar.update(1)
            if index + 1 == batches:
                totals = _fold(loss, engine.device)
                # Every rank scores the holdout: under ZeRO 3 a forward pass gathers the parameters from all of them.
                with torch.no_grad():
                    scores = model.predict(holdout, holdout_codes).float().cpu().numpy()
                if rank == 0:
                    metrics = {"train_loss": float(totals[0] / totals[1])} | {
                        f"holdout_{name}": value for name, value in quality.metrics(scores, snapshot.holdout_y).items()
                    }
                    tracking.log(metrics, step=epoch + 1)
                    bar.write(f"epoch {epoch + 1}/{config.epochs}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                loss = torch.zeros(2, dtype=torch.float64)
                _save(engine, checkpoints, config.keep_last, client_state(Position(epoch + 1, 0)))
            elif engine.global_steps % config.checkpoint_every_steps == 0:
                loss = _fold(loss, engine.device)
                _save(engine, checkpoints, config.keep_last, client_state(Position(epoch, (index + 1) * rows_per_batch)))
            if engine.global_steps == args.stop_after_steps:
                dist.barrier()  # no rank is still writing the checkpoint when the processes go
                os._exit(1)
    bar.close()
    seconds = time.perf_counter() - started
    memory = _training_memory(before_model, engine.device)  # before rank 0 exports: ONNX export is not training
    with _full_parameters(engine):
        state = {name: tensor.detach().float().cpu() for name, tensor in engine.module.state_dict().items()}
    if rank == 0:
        _write_outputs(
            state,
            snapshot,
            config,
            args.out,
            world,
            seconds,
            rows_trained * world,
            engine.global_steps,
            tracking,
            memory,
        )
    dist.barrier()


def _full_parameters(engine):
    """A context in which every rank holds the module's whole parameters: ZeRO stage 3 keeps only each rank's
    partition, and gathering them is a collective every rank enters (the other stages keep them whole)."""
    if engine.zero_optimization_stage() == 3:
        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    return contextlib.nullcontext()


def _write_outputs(
    state: dict[str, torch.Tensor],
    snapshot: Snapshot,
    config: TrainConfig,
    out: Path,
    world: int,
    seconds: float,
    rows_trained: int,
    global_steps: int,
    tracking: Tracking,
    memory: dict[str, int],
) -> None:
    """Write the trained weights ``state`` (float32, on the CPU) as ``model.pt``, ``model.onnx`` (verified against
    torch on the holdout) and ``metrics.json``."""
    model = build_model(snapshot, config)
    model.load_state_dict(state)
    model.eval()
    torch.save(model.state_dict(), out / "model.pt")
    onnx_path = export_onnx(model, out / "model.onnx")
    difference = verify_onnx(model, onnx_path, snapshot.holdout)
    quality = Quality(snapshot.label_kind)
    holdout = quality.metrics(torch_scores(model, snapshot.holdout), snapshot.holdout_y)
    metrics = {
        "snapshot_id": snapshot.snapshot_id,
        "label_kind": snapshot.label_kind,
        "rows": {"train": len(snapshot.train_y), "holdout": len(snapshot.holdout_y)},
        "epochs": config.epochs,
        "global_steps": global_steps,
        "world_size": world,
        "holdout": holdout,
        "onnx_max_abs_diff": difference,
        "seconds": round(seconds, 3),
        # Rows trained in this process's run (a resumed run counts from where it resumed).
        "samples_per_second": round(rows_trained / seconds, 1) if seconds > 0 else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "memory": memory,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    tracking.finish(
        {f"final_holdout_{k}": v for k, v in holdout.items()} | {"samples_per_second": metrics["samples_per_second"] or 0.0}
    )
    log.info(
        "wrote %s, %s and metrics.json: holdout %s", out / "model.pt", onnx_path, quality.describe(holdout[quality.headline])
    )


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    # Libraries (DeepSpeed, the ONNX exporter's passes) say only warnings; this module tells progress on rank 0.
    logging.basicConfig(format="%(message)s")
    log.setLevel(logging.INFO if int(os.environ.get("RANK", "0")) == 0 else logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    train(_resume_when_restarted(args), load_train_config(args.config))


if __name__ == "__main__":
    main()
