"""Retraining on a snapshot: train it (DeepSpeed under torchrun), judge the run against prod, register the model when
it is not worse and release it as a canary; or hand the whole retrain to Kubernetes as a TrainJob."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from feedback_loop.snapshots import find_snapshot
from offline_training.rendezvous import ONE_NODE, NodeGroup

if TYPE_CHECKING:
    from offline_training.candidate import CandidateReport, ProdModel
    from offline_training.kubernetes_api import Created, KubernetesApi
    from offline_training.release import ModelRelease

#: The training config a project's model trains with unless the project or the settings name one.
DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parent / "configs" / "mlp.yaml"
#: Where training's output is copied by default: the interpreter's own stderr, not whatever ``sys.stderr`` was when this
#: module was imported (a CLI test runner swaps its own stream in there, and closes it afterwards).
TRAINING_ECHO = sys.__stderr__


def run_folder(training_root: Path, snapshot_id: str) -> Path:
    """The folder of the training run on a snapshot (its full id): checkpoints, model files, metrics, model card."""
    return training_root / snapshot_id


def train_on_snapshot(
    snapshots_root: Path,
    training_root: Path,
    snapshot_id: str,
    *,
    train_config: Path | None = None,
    processes: int | None = None,
    resume: bool = False,
    tracking_uri: str | None = None,
    niceness: int = 0,
    nodes: NodeGroup = ONE_NODE,
    echo: TextIO | None = TRAINING_ECHO,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Path:
    """Train on a snapshot of ``snapshots_root`` (with ``train_config``, default ``DEFAULT_TRAIN_CONFIG``) as this node of
    ``nodes``, with ``processes`` workers (default: one per visible GPU, else 2), the run's folder
    ``<training_root>/<snapshot id>``; the path of its metrics (holdout AUC, log loss, Brier, samples/s). Without
    ``resume`` node 0 replaces an earlier run's folder. ``on_start`` gets the launcher process as it starts (see
    ``launch_training``)."""
    from offline_training.launch import default_processes, launch_training

    manifest, folder = find_snapshot(snapshots_root, snapshot_id)
    out = run_folder(training_root, manifest.snapshot_id)
    if not resume and nodes.node_rank == 0 and out.exists():
        shutil.rmtree(out)
    launch_training(
        folder,
        train_config or DEFAULT_TRAIN_CONFIG,
        out,
        processes or default_processes(),
        resume=resume,
        tracking_uri=tracking_uri,
        echo=echo,
        niceness=niceness,
        on_start=on_start,
        nodes=nodes,
    )
    return out / "metrics.json"


@dataclass(frozen=True)
class RetrainOutcome:
    """What retraining produced: the run judged against prod (``report``) and the canary share started (None: none)."""

    name: str
    snapshot_id: str
    run_dir: Path
    report: CandidateReport
    canary_percent: float | None


def evaluate_run(
    snapshots_root: Path,
    training_root: Path,
    snapshot_id: str,
    release: ModelRelease,
    name: str,
    prod_model: Callable[[Path], ProdModel | None],
    *,
    train_config: Path | None = None,
    owner: str,
    threshold: float,
    max_auc_drop: float,
    max_rmse_increase: float,
    quantize: bool,
    max_quantized_change: float,
    canary_percent: float | None = None,
    actor: str,
    reason: str = "",
) -> RetrainOutcome:
    """Judge the finished training run on a snapshot against prod (``offline_training/candidate.py``; ``prod_model``
    fetches prod's file into the folder it is given, None when there is no prod): the model card (``owner``'s), the
    version of ``name`` registered in ``release`` when the gate passes, and then, with ``canary_percent``, that version
    as the canary (recorded as ``actor``'s, for ``reason``). No canary goes out without a prod to compare it with."""
    from offline_training.candidate import evaluate_and_register
    from offline_training.train_config import load_train_config

    manifest, folder = find_snapshot(snapshots_root, snapshot_id)
    run_dir = run_folder(training_root, manifest.snapshot_id)
    config = load_train_config(train_config or DEFAULT_TRAIN_CONFIG)
    prod = prod_model(run_dir / "prod")
    report = evaluate_and_register(
        run_dir,
        folder,
        config.holdout_fraction,
        release,
        name,
        prod,
        owner=owner,
        threshold=threshold,
        max_auc_drop=max_auc_drop,
        max_rmse_increase=max_rmse_increase,
        quantize=quantize,
        max_quantized_change=max_quantized_change,
    )
    started = None
    if canary_percent and report.version is not None and prod is not None:
        why = reason or f"retrained on snapshot {manifest.snapshot_id}"
        release.start_canary(name, report.version, canary_percent / 100, actor, why)
        started = canary_percent
    return RetrainOutcome(name, manifest.snapshot_id, run_dir, report, started)


@dataclass(frozen=True)
class TrainJobStarted:
    """A retrain handed to Kubernetes: the TrainJob training on ``snapshot_id``, whose node 0 judges, registers and
    releases the model as `loopline train --canary` does."""

    snapshot_id: str
    trainjob: Created


def start_trainjob_retrain(
    template_path: Path,
    snapshot_id: str,
    fired_ms: int,
    reason: str,
    canary_percent: float,
    kubernetes: KubernetesApi | None = None,
) -> TrainJobStarted:
    """Create the TrainJob of the firing at ``fired_ms`` on ``snapshot_id`` from the template at ``template_path``,
    through ``kubernetes`` (default: the pod's own API server, as its service account); a retry of the same firing finds
    the TrainJob its first attempt created."""
    from offline_training.kubernetes_api import KubernetesApi
    from offline_training.trainjob import load_template, start_retrain

    created = start_retrain(
        kubernetes or KubernetesApi.in_cluster(),
        load_template(template_path),
        snapshot_id=snapshot_id,
        fired_ms=fired_ms,
        canary_percent=canary_percent,
        reason=reason,
    )
    return TrainJobStarted(snapshot_id, created)
