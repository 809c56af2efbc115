"""The retraining path wired from settings: examples → snapshot (``feedback_loop/snapshot_taking.py``) → training →
evaluation against prod → registration → canary (``offline_training/retraining.py``), and the retrain trigger's look
(``feedback_loop/retrain_check.py``): what `loopline snapshot create`, `loopline train` and `loopline retrain watch`
run."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from feedback_loop.retrain_check import TRIGGER_ACTOR, AlertsUnread, record_firing
from feedback_loop.retrain_trigger import FiringAlert, TriggerDecision
from feedback_loop.snapshots import Manifest
from infra.errors import StackError
from loopline.components import feature_defaults, feature_plan, model_registry_reader, model_release, project
from loopline.settings import Settings
from offline_training import retraining
from offline_training.retraining import TRAINING_ECHO, RetrainOutcome, TrainJobStarted

if TYPE_CHECKING:
    from rich.console import Console

    from offline_training.candidate import ProdModel
    from offline_training.kubernetes_api import KubernetesApi


def create_snapshot(
    settings: Settings, from_ms: int | None, to_ms: int | None, backfill: bool = False, model_name: str | None = None
) -> Manifest:
    """Snapshot the examples scored in ``[from_ms, to_ms)``: the joiner's (``training.examples``; only ``model_name``'s
    when given), or with ``backfill`` examples recomputed point in time from the event log for every labeled scored
    event, with the project's model inputs."""
    from feedback_loop.snapshot_taking import snapshot_logged_examples, snapshot_recomputed_examples

    kafka, declared = settings.kafka, project(settings)
    if backfill:
        return snapshot_recomputed_examples(
            feature_plan(settings), declared, kafka.bootstrap, settings.snapshots_root, from_ms, to_ms, kafka.client_config
        )
    return snapshot_logged_examples(
        kafka.bootstrap,
        settings.feedback.examples_topic,
        settings.snapshots_root,
        declared.labels.kind,
        from_ms,
        to_ms,
        kafka.client_config,
        model_name,
    )


def backfill_snapshot(settings: Settings, snapshot_id: str, features: list[str], console: Console | None = None) -> Manifest:
    """A new snapshot: ``snapshot_id``'s examples with ``features`` (``view:feature``, added since it was taken), each
    read as of its request's time from the retained events (``feedback_loop/snapshot_taking.py``), with progress on
    ``console``."""
    from rich.progress import Progress, TaskID

    from feedback_loop.snapshot_taking import extend_snapshot

    with Progress(console=console, transient=True) as progress:
        task: TaskID | None = None

        def shown(description: str, done: int, steps: int) -> None:
            nonlocal task
            if task is None:
                task = progress.add_task(description, total=steps)
            progress.update(task, description=description, completed=done, total=steps)

        plan, kafka = feature_plan(settings), settings.kafka
        return extend_snapshot(
            settings.snapshots_root,
            snapshot_id,
            features,
            plan,
            feature_defaults(settings),
            kafka.bootstrap,
            kafka.client_config,
            progress=shown,
        )


def train_on_snapshot(
    settings: Settings,
    snapshot_id: str,
    resume: bool = False,
    processes: int | None = None,
    echo: TextIO | None = TRAINING_ECHO,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv: str | None = None,
) -> Path:
    """Train on a snapshot as node ``node_rank`` of ``nnodes`` meeting at ``rdzv`` (alone by default), the run's folder
    ``<feedback.train_dir>/<snapshot id>`` (``offline_training.retraining.train_on_snapshot``); the path of its metrics."""
    from offline_training.rendezvous import NodeGroup

    feedback = settings.feedback
    return retraining.train_on_snapshot(
        settings.snapshots_root,
        settings.training_root,
        snapshot_id,
        train_config=feedback.train_config,
        processes=processes or feedback.train_processes,
        resume=resume,
        tracking_uri=settings.tracking_uri,
        niceness=feedback.train_niceness,
        nodes=NodeGroup(nnodes=nnodes, node_rank=node_rank, rdzv=rdzv, max_restarts=feedback.train_max_restarts),
        echo=echo,
        on_start=on_start,
    )


def run_folder(settings: Settings, snapshot_id: str) -> Path:
    """The folder of the training run on a snapshot (its full id): checkpoints, model files, metrics, model card."""
    return retraining.run_folder(settings.training_root, snapshot_id)


def _prod_model(settings: Settings, destination: Path) -> ProdModel | None:
    """The version ``prod`` names now and its file, downloaded and verified as serving does; None when there is none."""
    from mlflow.exceptions import MlflowException

    from offline_training.candidate import ProdModel
    from online.model_registry_reader import ArtifactRefused

    reader = model_registry_reader(settings)
    try:
        version = reader.assignment().prod
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None  # no version of this model was ever registered
    if version is None:
        return None
    shutil.rmtree(destination, ignore_errors=True)
    try:
        return ProdModel(version, reader.fetch(version, destination))
    except ArtifactRefused as err:
        return ProdModel(version, None, str(err))


def evaluate_run(
    settings: Settings,
    snapshot_id: str,
    *,
    quantize: bool | None = None,
    canary_percent: float | None = None,
    actor: str,
    reason: str = "",
    owner: str | None = None,
) -> RetrainOutcome:
    """Judge the finished training run on a snapshot against prod with the gate of ``retrain.*`` (the model card
    ``owner``'s, default ``retrain.owner``; INT8 tried with ``quantize``, default ``retrain.quantize``), and with
    ``canary_percent`` release the registered version as the canary (``offline_training.retraining.evaluate_run``)."""
    options = settings.retrain
    return retraining.evaluate_run(
        settings.snapshots_root,
        settings.training_root,
        snapshot_id,
        model_release(settings),
        settings.serving.model_name,
        lambda destination: _prod_model(settings, destination),
        train_config=settings.feedback.train_config,
        owner=owner or options.owner,
        threshold=options.threshold,
        max_auc_drop=options.max_auc_drop,
        max_rmse_increase=options.max_rmse_increase,
        quantize=options.quantize if quantize is None else quantize,
        max_quantized_change=options.max_quantized_change,
        canary_percent=canary_percent,
        actor=actor,
        reason=reason,
    )


def retrain(
    settings: Settings,
    snapshot_id: str | None = None,
    *,
    resume: bool = False,
    processes: int | None = None,
    quantize: bool | None = None,
    canary_percent: float | None = None,
    actor: str,
    reason: str = "",
    owner: str | None = None,
    echo: TextIO | None = TRAINING_ECHO,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    nnodes: int = 1,
    rdzv: str | None = None,
) -> RetrainOutcome:
    """Snapshot (every logged example of the served model, unless ``snapshot_id`` names one) → train (its output copied
    to ``echo``; as node 0 of ``nnodes`` meeting at ``rdzv``, see ``train_on_snapshot``) → evaluate against prod →
    register when not worse, the model card ``owner``'s (default ``retrain.owner``) → canary on ``canary_percent`` of
    requests: `loopline train`, the retrain trigger and the demo run this."""
    if snapshot_id is None:
        snapshot_id = create_snapshot(settings, None, None, model_name=settings.serving.model_name).snapshot_id
    train_on_snapshot(
        settings, snapshot_id, resume=resume, processes=processes, echo=echo, on_start=on_start, nnodes=nnodes, rdzv=rdzv
    )
    return evaluate_run(
        settings, snapshot_id, quantize=quantize, canary_percent=canary_percent, actor=actor, reason=reason, owner=owner
    )


def firing_alerts(settings: Settings) -> list[FiringAlert]:
    """The alerts of ``retrain.alerts`` firing now in the stack's Prometheus; AlertsUnread when it does not answer."""
    from feedback_loop.retrain_check import firing_alerts as firing
    from infra.prometheus_server import alerts

    try:
        return firing(alerts(f"http://{settings.prometheus.host}:{settings.prometheus.port}"), settings.retrain.alerts)
    except StackError as err:
        raise AlertsUnread(str(err)) from err


def check_trigger(settings: Settings, now_ms: int | None = None) -> TriggerDecision:
    """The retrain trigger's verdict now (``feedback_loop.retrain_check.check_trigger``): prod's labeled examples over
    the window (``training.examples``, unless ``retrain.mode`` is off), the alerts firing in Prometheus (unless
    ``retrain.alert_mode`` is off), the model registry's aliases and when the trigger last fired."""
    from feedback_loop.example_log import logged_examples
    from feedback_loop.retrain_check import check_trigger as check
    from offline_training.evaluation import Quality

    options, kafka = settings.retrain, settings.kafka
    kind = project(settings).labels.kind
    judged = options.mode != "off"

    topic = settings.feedback.examples_topic

    def examples(since_ms: int, model_name: str) -> list:
        return logged_examples(kafka.bootstrap, topic, since_ms, None, kafka.client_config, model_name)[0]

    return check(
        dataclasses.replace(options.trigger_policy(), label_kind=kind),
        model_release(settings).client,
        settings.serving.model_name,
        examples=examples if judged else None,
        quality=(lambda scores, labels: Quality(kind).metrics(scores, labels, options.threshold)) if judged else None,
        alerts=None if options.alert_mode == "off" else lambda: firing_alerts(settings),
        now_ms=now_ms,
    )


def start_retrain_trainjob(
    settings: Settings, snapshot_id: str, fired_ms: int, reason: str, kubernetes: KubernetesApi | None = None
) -> TrainJobStarted:
    """Create the TrainJob of the firing at ``fired_ms`` on ``snapshot_id`` from ``retrain.trainjob_template``, through
    ``kubernetes`` (default: the pod's own API server, as its service account)."""
    options = settings.retrain
    return retraining.start_trainjob_retrain(
        options.trainjob_template, snapshot_id, fired_ms, reason, options.canary_percent, kubernetes
    )


def trigger_step(
    settings: Settings, kubernetes: KubernetesApi | None = None
) -> tuple[TriggerDecision, RetrainOutcome | TrainJobStarted | None]:
    """One look of `loopline retrain watch`: the verdict and, when it fires with a cause whose mode is ``retrain``, the
    retraining it ran (``retrain.launcher: local``) or the TrainJob it created for it (``trainjob``; through
    ``kubernetes``, default the pod's API server), on a snapshot of the served model's examples either way.

    A firing is recorded on the registered model before anything runs (in ``notify`` mode too), so the cooldown holds
    even if the retraining fails or the watcher restarts."""
    decision = check_trigger(settings)
    if not decision.fire:
        return decision, None
    name, fired_ms = settings.serving.model_name, int(time.time() * 1000)
    record_firing(model_release(settings).client, name, fired_ms)
    if settings.retrain.mode_for(decision.causes) != "retrain":
        return decision, None
    if settings.retrain.launcher == "trainjob":
        snapshot_id = create_snapshot(settings, None, None, model_name=name).snapshot_id
        return decision, start_retrain_trainjob(settings, snapshot_id, fired_ms, decision.reason, kubernetes)
    outcome = retrain(settings, canary_percent=settings.retrain.canary_percent, actor=TRIGGER_ACTOR, reason=decision.reason)
    return decision, outcome
