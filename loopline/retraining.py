"""The retraining path wired from settings: examples → snapshot → training → evaluation against prod → registration →
canary (what `loopline snapshot create`, `loopline train` and `loopline retrain watch` run)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from feedback_loop.example_log import backfill_examples, logged_examples
from feedback_loop.retrain_trigger import FiringAlert, TriggerDecision, decide
from feedback_loop.snapshots import Manifest, examples_frame, find_snapshot, write_snapshot
from infra.errors import StackError
from loopline.components import feature_defaults, feature_plan, model_registry_reader, model_release, project
from loopline.settings import Settings
from streams.topics import read_topic

if TYPE_CHECKING:
    from rich.console import Console

    from offline_training.candidate import CandidateReport, ProdModel
    from offline_training.kubernetes_api import Created, KubernetesApi
    from streams.feature_plan import ViewPlan

#: The training config a project's model trains with unless the project or the settings name one.
DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "offline_training" / "configs" / "mlp.yaml"
#: Who the retrain trigger is in the alias history.
TRIGGER_ACTOR = "retrain-trigger"
#: The registered model's tag holding when the trigger last fired (epoch ms): the cooldown survives a restarted watcher,
#: and every watcher of the model registry sees it.
LAST_FIRED_TAG = "loopline.retrain_trigger.last_fired_ms"
#: Where training's output is copied by default: the interpreter's own stderr, not whatever ``sys.stderr`` was when this
#: module was imported (a CLI test runner swaps its own stream in there, and closes it afterwards).
TRAINING_ECHO = sys.__stderr__


def create_snapshot(
    settings: Settings, from_ms: int | None, to_ms: int | None, backfill: bool = False, model_name: str | None = None
) -> Manifest:
    """Snapshot the examples scored in ``[from_ms, to_ms)``: the joiner's (``training.examples``; only ``model_name``'s
    when given), or with ``backfill`` examples recomputed point in time from the event log for every labeled scored
    event, with the project's model inputs."""
    kafka, declared = settings.kafka, project(settings)
    if backfill:
        plan = feature_plan(settings)
        events = {topic: read_topic(kafka.bootstrap, topic, kafka.client_config) for topic in plan.topics}
        labels = read_topic(kafka.bootstrap, declared.labels.topic, kafka.client_config)
        frame = backfill_examples(plan, declared, events, labels, declared.spec.model.inputs)
        if from_ms is not None:
            frame = frame[frame["predicted_at_ms"] >= from_ms]
        if to_ms is not None:
            frame = frame[frame["predicted_at_ms"] < to_ms]
        source = {
            "backfill": {
                "topics": sorted(events),
                "labels": declared.labels.topic,
                "events": sum(len(messages) for messages in events.values()),
            }
        }
    else:
        examples, source = logged_examples(
            kafka.bootstrap, settings.feedback.examples_topic, from_ms, to_ms, kafka.client_config, model_name
        )
        frame = examples_frame(examples)
    return write_snapshot(
        frame,
        settings.snapshots_root,
        kind="backfill" if backfill else "feedback",
        source=source,
        time_range={"from_ms": from_ms, "to_ms": to_ms},
        label_kind=declared.labels.kind,
    )


def backfill_snapshot(settings: Settings, snapshot_id: str, features: list[str], console: Console | None = None) -> Manifest:
    """A new snapshot: ``snapshot_id``'s examples with ``features`` (``view:feature``, added since it was taken), each
    read as of its request's time from the retained events (``feedback_loop/snapshot_backfill.py``), with progress on
    ``console``. Refused (SnapshotError) for a snapshot not taken from the example log, and where a topic no longer
    retains the windows the earliest request needs."""
    from rich.progress import Progress

    from feedback_loop.snapshot_backfill import backfill_features, request_points, requested_features
    from feedback_loop.snapshots import SnapshotError, read_snapshot
    from streams.recompute import accepted_events
    from streams.retention_check import deleted_until_ms

    features = list(dict.fromkeys(features))  # a feature named twice is backfilled once
    manifest, frame = read_snapshot(settings.snapshots_root, snapshot_id)
    if "topic" not in manifest.source:
        raise SnapshotError(
            f"snapshot {manifest.snapshot_id} was not taken from the example log ({manifest.kind}): make it "
            "anew with the features (loopline snapshot create --backfill) instead"
        )
    plan, kafka = feature_plan(settings), settings.kafka
    wanted = requested_features(plan, frame, features)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"reading the example log {manifest.source['topic']}", total=1 + 2 * len(wanted))
        points = request_points(
            frame, logged_examples(kafka.bootstrap, manifest.source["topic"], None, None, kafka.client_config)[0]
        )
        progress.advance(task)
        events, read = {}, 0
        reach = {
            topic: plan.lookback_ms(r for view, references in wanted if view.topic == topic for r in references)
            for topic in {view.topic for view, _ in wanted}
        }
        for view, _ in wanted:
            span = reach[view.topic]
            since = None if span is None else int(points["requested_at_ms"].min()) - span - plan.out_of_orderness_ms
            deleted = deleted_until_ms(kafka.bootstrap, kafka.client_config, view.topic)
            if deleted is not None and (since is None or deleted > since):
                needed = (
                    "every event of an entity (a feature without a window, of a view without a ttl)"
                    if since is None
                    else (f"them since {since} ms")
                )
                raise SnapshotError(
                    f"{view.topic} no longer holds events from before {deleted} ms (deleted by retention), but "
                    f"{view.name}'s features at the snapshot's earliest request need {needed}: backfilled, "
                    "they would be wrong"
                )
            progress.update(task, description=f"reading {view.topic}")
            if view.topic not in events:
                messages = read_topic(kafka.bootstrap, view.topic, kafka.client_config, since_ms=since)
                events[view.topic], read = accepted_events(plan, view.topic, messages)[0], read + len(messages)
            progress.advance(task)

        def recomputing(view: ViewPlan) -> None:
            progress.update(task, description=f"recomputing {view.name} as of {len(frame):,} requests", advance=1)

        added = backfill_features(frame, points, wanted, events, feature_defaults(settings), on_view=recomputing)
    source = {**manifest.source, "extends": manifest.snapshot_id, "backfilled": list(features), "events": read}
    time_range = {k: v for k, v in manifest.time_range.items() if k in ("from_ms", "to_ms")}
    return write_snapshot(
        added, settings.snapshots_root, kind=manifest.kind, source=source, time_range=time_range, label_kind=manifest.label_kind
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
    """Train on a snapshot (DeepSpeed under torchrun) as node ``node_rank`` of ``nnodes`` meeting at ``rdzv`` (alone by
    default), the run's folder ``<feedback.train_dir>/<snapshot id>``; the path of its metrics (holdout AUC, log loss,
    Brier, samples/s). Without ``resume`` node 0 replaces an earlier run's folder. ``on_start`` gets the launcher process
    as it starts (see ``launch_training``)."""
    from offline_training.launch import default_processes, launch_training
    from offline_training.rendezvous import NodeGroup

    nodes = NodeGroup(nnodes=nnodes, node_rank=node_rank, rdzv=rdzv, max_restarts=settings.feedback.train_max_restarts)
    manifest, folder = find_snapshot(settings.snapshots_root, snapshot_id)
    out = run_folder(settings, manifest.snapshot_id)
    if not resume and node_rank == 0 and out.exists():
        shutil.rmtree(out)
    processes = processes or settings.feedback.train_processes or default_processes()
    launch_training(
        folder,
        settings.feedback.train_config or DEFAULT_TRAIN_CONFIG,
        out,
        processes,
        resume=resume,
        tracking_uri=settings.tracking_uri,
        echo=echo,
        niceness=settings.feedback.train_niceness,
        on_start=on_start,
        nodes=nodes,
    )
    return out / "metrics.json"


def run_folder(settings: Settings, snapshot_id: str) -> Path:
    """The folder of the training run on a snapshot (its full id): checkpoints, model files, metrics, model card."""
    return settings.training_root / snapshot_id


@dataclass(frozen=True)
class RetrainOutcome:
    """What retraining produced: the run judged against prod (``report``) and the canary share started (None: none)."""

    name: str
    snapshot_id: str
    run_dir: Path
    report: CandidateReport
    canary_percent: float | None


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
    """Judge the finished training run on a snapshot against prod (``offline_training/candidate.py``): the model card
    (``owner``'s, default ``retrain.owner``), the version registered when the gate passes, and then, with
    ``canary_percent``, that version as the canary (recorded as ``actor``'s, for ``reason``). No canary goes out without
    a prod to compare it with."""
    from offline_training.candidate import evaluate_and_register
    from offline_training.train_config import load_train_config

    manifest, folder = find_snapshot(settings.snapshots_root, snapshot_id)
    run_dir, options, name = run_folder(settings, manifest.snapshot_id), settings.retrain, settings.serving.model_name
    config = load_train_config(settings.feedback.train_config or DEFAULT_TRAIN_CONFIG)
    prod = _prod_model(settings, run_dir / "prod")
    release = model_release(settings)
    report = evaluate_and_register(
        run_dir,
        folder,
        config.holdout_fraction,
        release,
        name,
        prod,
        owner=owner or options.owner,
        threshold=options.threshold,
        max_auc_drop=options.max_auc_drop,
        max_rmse_increase=options.max_rmse_increase,
        quantize=options.quantize if quantize is None else quantize,
        max_quantized_change=options.max_quantized_change,
    )
    started = None
    if canary_percent and report.version is not None and prod is not None:
        why = reason or f"retrained on snapshot {manifest.snapshot_id}"
        release.start_canary(name, report.version, canary_percent / 100, actor, why)
        started = canary_percent
    return RetrainOutcome(name, manifest.snapshot_id, run_dir, report, started)


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
    """Snapshot (every logged example of the served model, unless ``snapshot_id`` names one) → train (its output copied to ``echo``;
    as node 0 of ``nnodes`` meeting at ``rdzv``, see ``train_on_snapshot``) → evaluate against prod → register when not
    worse, the model card ``owner``'s (default ``retrain.owner``) → canary on ``canary_percent`` of requests: `loopline
    train`, the retrain trigger and the demo run this."""
    if snapshot_id is None:
        snapshot_id = create_snapshot(settings, None, None, model_name=settings.serving.model_name).snapshot_id
    train_on_snapshot(
        settings, snapshot_id, resume=resume, processes=processes, echo=echo, on_start=on_start, nnodes=nnodes, rdzv=rdzv
    )
    return evaluate_run(
        settings, snapshot_id, quantize=quantize, canary_percent=canary_percent, actor=actor, reason=reason, owner=owner
    )


def firing_alerts(settings: Settings) -> list[FiringAlert]:
    """The alerts of ``retrain.alerts`` firing now in the stack's Prometheus."""
    from infra.prometheus_server import alerts

    address = f"http://{settings.prometheus.host}:{settings.prometheus.port}"
    return [
        FiringAlert(a["labels"]["alertname"], a["labels"], a.get("activeAt", ""))
        for a in alerts(address)
        if a.get("state") == "firing" and a["labels"].get("alertname") in settings.retrain.alerts
    ]


def check_trigger(settings: Settings, now_ms: int | None = None) -> TriggerDecision:
    """The retrain trigger's verdict now: prod's labeled examples over the window (``training.examples``, unless
    ``retrain.mode`` is off), the alerts firing in Prometheus (unless ``retrain.alert_mode`` is off), the model registry's
    aliases and when the trigger last fired. Prometheus not answering is said in the reason; quality is still judged."""
    from mlflow.exceptions import MlflowException

    from offline_training.evaluation import Quality
    from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    options, kafka = settings.retrain, settings.kafka
    kind = project(settings).labels.kind
    policy = dataclasses.replace(options.trigger_policy(), label_kind=kind)
    try:
        model = model_release(settings).client.get_registered_model(settings.serving.model_name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return TriggerDecision(False, f"{settings.serving.model_name} is not registered: nothing to judge")
    aliases = {alias: str(version) for alias, version in model.aliases.items()}
    fired = model.tags.get(LAST_FIRED_TAG)
    examples: list = []
    if options.mode != "off":
        since_ms = now_ms - int(options.window_s * 1000)
        examples, _ = logged_examples(
            kafka.bootstrap, settings.feedback.examples_topic, since_ms, None, kafka.client_config, model.name
        )
    firing: list[FiringAlert] | None = None
    unread = ""
    if options.alert_mode != "off":
        try:
            firing = firing_alerts(settings)
        except StackError as err:
            unread = f"; alerts not read: {err}"
    decision = decide(
        policy,
        examples,
        model_name=model.name,
        prod_version=aliases.get(PROD_ALIAS),
        canary_version=aliases.get(CANARY_ALIAS),
        now_ms=now_ms,
        last_fired_ms=int(fired) if fired else None,
        quality=None
        if options.mode == "off"
        else lambda scores, labels: Quality(kind).metrics(scores, labels, options.threshold),
        alerts=firing,
    )
    return dataclasses.replace(decision, reason=decision.reason + unread)


@dataclass(frozen=True)
class TrainJobStarted:
    """A retrain handed to Kubernetes (``retrain.launcher: trainjob``): the TrainJob training on ``snapshot_id``, whose
    node 0 judges, registers and releases the model as `loopline train --canary` does."""

    snapshot_id: str
    trainjob: Created


def start_retrain_trainjob(
    settings: Settings, snapshot_id: str, fired_ms: int, reason: str, kubernetes: KubernetesApi | None = None
) -> TrainJobStarted:
    """Create the TrainJob of the firing at ``fired_ms`` on ``snapshot_id`` from ``retrain.trainjob_template``, through
    ``kubernetes`` (default: the pod's own API server, as its service account); a retry of the same firing finds the
    TrainJob its first attempt created."""
    from offline_training.kubernetes_api import KubernetesApi
    from offline_training.trainjob import load_template, start_retrain

    options = settings.retrain
    template = load_template(options.trainjob_template)
    created = start_retrain(
        kubernetes or KubernetesApi.in_cluster(),
        template,
        snapshot_id=snapshot_id,
        fired_ms=fired_ms,
        canary_percent=options.canary_percent,
        reason=reason,
    )
    return TrainJobStarted(snapshot_id, created)


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
    model_release(settings).client.set_registered_model_tag(name, LAST_FIRED_TAG, str(fired_ms))
    if settings.retrain.mode_for(decision.causes) != "retrain":
        return decision, None
    if settings.retrain.launcher == "trainjob":
        snapshot_id = create_snapshot(settings, None, None, model_name=name).snapshot_id
        return decision, start_retrain_trainjob(settings, snapshot_id, fired_ms, decision.reason, kubernetes)
    outcome = retrain(settings, canary_percent=settings.retrain.canary_percent, actor=TRIGGER_ACTOR, reason=decision.reason)
    return decision, outcome
