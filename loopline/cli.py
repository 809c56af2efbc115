"""The ``loopline`` command: projects, the local stack, topics, contracts, the synthetic world, jobs, serving, the
feedback loop and the demo."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from confluent_kafka import KafkaException
from pydantic import SecretStr, ValidationError
from redis.exceptions import RedisClusterException
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from feedback_loop.snapshots import SnapshotError
from infra.errors import StackError
from infra.service import tail
from loopline.components import apply_loopline_topics, build_stack, project
from loopline.produce import produce_stream
from loopline.settings import (
    Settings,
    UnknownSettingError,
    forget_stack_shape,
    read_stack_shape,
    remember_stack_shape,
)
from loopline.tables import (
    alias_history_table,
    prebuilds_table,
    release_step_line,
    snapshot_diff_table,
    snapshot_table,
    stack_table,
    topics_table,
)
from offline_training.kubernetes_api import KubernetesError
from offline_training.launch import TrainingError
from offline_training.release import ModelRelease, ReleaseError
from offline_training.rendezvous import NodeGroupError
from offline_training.trainjob import TrainJobTemplateError
from schemas.compatibility import CompatibilityError, check_registered_schemas
from schemas.contracts import ContractError
from schemas.model_registry import PROD_ALIAS
from schemas.project import ProjectError
from streams.feature_plan import PlanError
from streams.job_archives import JobArchiveError
from streams.job_settings import JobStateError
from streams.producer import DeliveryError
from streams.topics import TopicSpecError

if TYPE_CHECKING:
    from loopline.cluster_jobs import Submission
    from loopline.retraining import RetrainOutcome
    from streams.flink_submit import FlinkImage


app = typer.Typer(help="Loopline: streaming-first real-time features and inference.", pretty_exceptions_enable=False)
stack_app = typer.Typer(help="The local stack: Kafka (KRaft), Redis, Flink runtime.")
topics_app = typer.Typer(help="Kafka topics from the specs in schemas/.")
schemas_app = typer.Typer(help="Record contracts and their compatibility.")
app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
stream_app = typer.Typer(help="The streaming feature job compiled from the Feast stream feature views.")
app.add_typer(stream_app, name="stream")
flink_app = typer.Typer(help="A standalone Flink session cluster (JobManager + TaskManagers) from the PyFlink distribution.")
app.add_typer(flink_app, name="flink")
models_app = typer.Typer(help="Model versions in the MLflow registry: register, canary, promote.")
app.add_typer(models_app, name="models")

console = Console()

#: Errors the user can act on: printed as one line, never as a trace.
USER_ERRORS = (
    StackError,
    TopicSpecError,
    CompatibilityError,
    DeliveryError,
    KafkaException,
    TimeoutError,
    PlanError,
    JobStateError,
    ReleaseError,
    SnapshotError,
    TrainingError,
    NodeGroupError,
    UnknownSettingError,
    JobArchiveError,
    ValidationError,
    urllib.error.URLError,
    RedisClusterException,
    KubernetesError,
    TrainJobTemplateError,
    ProjectError,
    ContractError,
)


@app.callback()
def main_options(
    project: Annotated[
        Path | None,
        typer.Option(
            "--project",
            help="The Loopline project to act on (a folder with "
            "loopline_project.yaml); default: the working directory's, or the nearest "
            "folder above it.",
            envvar="LOOPLINE_PROJECT",
        ),
    ] = None,
) -> None:
    """Loopline: streaming-first real-time features and inference, for the project in the working directory."""
    if project is not None:
        # Every command's settings, and every Loopline process a command starts, act on it.
        os.environ["LOOPLINE_PROJECT"] = str(project.absolute())


@app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="The new project's folder (new, or empty).")],
    template: Annotated[str, typer.Option(help="The template to start from: fraud, delivery.")] = "fraud",
) -> None:
    """Make a Loopline project from a template, as `feast init` does: a Feast repo, contracts, labels, model, a synthetic
    world. Every command run in the folder acts on it."""
    from loopline.project import init_project
    from schemas.project import load_project

    made = load_project(init_project(directory, template))
    console.print(
        f"made {made.name} project in {made.path} from the {template} template; next: `cd {directory}` and "
        "`loopline stack up`, `loopline apply`, `loopline stream submit` (docs/guide.md walks through the rest)"
    )


def settings(**overrides: Any) -> Settings:
    """The settings in force for this command (``overrides``: its options that set settings, by section)."""
    return Settings(**overrides)


#: What in a kafka.client_config key marks its value a secret (librdkafka's sasl.password, ssl.key.password, ...;
#: pydantic-settings spells a key from the environment with "_" for ".").
_SECRET_KEY_PARTS = ("password", "secret", "token", "sasl.jaas.config")


def _masked_client_config(client_config: dict[str, str]) -> dict[str, str]:
    """``kafka.client_config`` as ``loopline config`` prints it: secret-looking values masked as SecretStr settings are."""
    return {
        key: str(SecretStr(value)) if any(part in key.lower().replace("_", ".") for part in _SECRET_KEY_PARTS) else value
        for key, value in client_config.items()
    }


@app.command("config")
def show_config() -> None:
    """Print the settings in force (override with LOOPLINE_* variables or a loopline.yaml); secrets masked."""
    shown = settings().model_dump(mode="json")
    shown["kafka"]["client_config"] = _masked_client_config(shown["kafka"]["client_config"])
    console.print_json(json.dumps(shown))


@stack_app.command("setup")
def stack_setup() -> None:
    """Install missing Debian packages (as root), fetch the pinned jars from Maven Central, and build what would
    otherwise be built at first use (JVM operators, gRPC modules, DeepSpeed's ops)."""
    from loopline.prebuilds import prebuilds

    config = settings()
    added = build_stack(config).setup()
    console.print(f"set up: {', '.join(added)}" if added else "set up: nothing missing")
    built = []
    columns = (SpinnerColumn(), TextColumn("building {task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        for prebuild in prebuilds(config):
            task, began = progress.add_task(prebuild.name, total=1), time.monotonic()
            made = prebuild.build()
            progress.update(task, completed=1, visible=False)
            built.append((prebuild.name, made, time.monotonic() - began))
    console.print(prebuilds_table(built))


@stack_app.command("up")
def stack_up(
    kafka_brokers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=9,
            help="Kafka as a cluster of this many KRaft nodes (kafka.brokers); remembered until `stack down --wipe`.",
        ),
    ] = None,
    redis_cluster: Annotated[
        int | None,
        typer.Option(
            min=3,
            max=16,
            help="Redis as a Redis Cluster of this many masters, "
            "each with redis.cluster_replicas replicas (redis.mode cluster, "
            "redis.cluster_masters); remembered until `stack down --wipe`.",
        ),
    ] = None,
) -> None:
    """Start Kafka and Redis unless running, wait until each answers, check Flink; print status."""
    shape = {"kafka": {"brokers": kafka_brokers}} if kafka_brokers is not None else {}
    if redis_cluster is not None:
        shape["redis"] = {"mode": "cluster", "cluster_masters": redis_cluster}
    config = settings(**shape)
    remembered = read_stack_shape(config.home).get("kafka", {}).get("brokers", 1)
    if config.kafka.brokers != remembered:
        kafka = config.kafka.model_copy(update={"brokers": remembered})
        if build_stack(config.model_copy(update={"kafka": kafka})).kafka.formatted():
            raise typer.BadParameter(
                f"the stack's Kafka holds the data of {remembered} node(s); {config.kafka.brokers} cannot take it over. "
                "Run `loopline stack down --wipe` first (deletes the stack's data), then `stack up` again.",
                param_hint="--kafka-brokers",
            )
    stack = build_stack(config)
    reports = stack.up()
    if shape:
        remember_stack_shape(config.home, shape)
    console.print(stack_table(stack.status(), reports))


@stack_app.command("down")
def stack_down(
    wipe: Annotated[bool, typer.Option(help="Also delete the services' data and the Flink jobs' checkpoints.")] = False,
) -> None:
    """Stop the stack; its data and the jobs' checkpoints stay unless --wipe."""
    config = settings()
    stopped = build_stack(config).down(wipe=wipe)
    if wipe:
        forget_stack_shape(config.home)
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}" + ("; data and checkpoints wiped" if wipe else ""))


@stack_app.command("status")
def stack_status() -> None:
    """Show each service's state, address, version and pid."""
    console.print(stack_table(build_stack(settings()).status()))


@stack_app.command("logs")
def stack_logs(
    service: Annotated[str, typer.Argument(help="kafka or redis")],
    lines: Annotated[int, typer.Option("-n", help="How many lines.")] = 50,
) -> None:
    """Print the last lines of a service's log."""
    stack = build_stack(settings())
    by_name = {s.name: s for s in stack.services}
    if service not in by_name:
        raise typer.BadParameter(f"unknown service {service!r}; choose from {', '.join(by_name)}")
    for line in tail(by_name[service].log_file, lines):
        print(line)


@app.command("apply")
def apply_all(
    topics: Annotated[
        bool, typer.Option(help="Also `topics apply`; --no-topics where an operator owns the topics (Strimzi's KafkaTopics).")
    ] = True,
) -> None:
    """`feast apply` on the feature repo (the Feast registry and Redis of these settings), then `topics apply`. The
    stream feature views are compiled against the project's contracts first: what the engine cannot compute is
    refused before anything is registered, naming the view."""
    from feature_store.config import apply_definitions, repo_stream_views
    from streams.feature_plan import compile_plan

    config = settings()
    plan = compile_plan(repo_stream_views(config.repo_path), project(config))
    console.print(f"the streaming plan: {len(plan.views)} views over {', '.join(plan.topics)}", highlight=False)
    views = apply_definitions(
        config.feast_registry_path, config.redis_connection, config.repo_path, redis_cluster=config.redis_cluster
    )
    console.print(f"feature views applied: {', '.join(views)} (Feast registry {config.feast_registry_path})")
    if topics:
        console.print(topics_table(apply_loopline_topics(config)))


@flink_app.command("up")
def flink_up(
    taskmanagers: Annotated[int | None, typer.Option(min=1, help="TaskManagers (default flink.taskmanagers).")] = None,
    slots: Annotated[int | None, typer.Option(min=1, help="Task slots per TaskManager (default flink.slots).")] = None,
) -> None:
    """Start the session cluster unless running (its Web UI and REST API on flink.rest_port); print its status."""
    from loopline.components import flink_session

    cluster = flink_session(settings(), taskmanagers, slots)
    started = cluster.up()
    console.print(stack_table(cluster.status()))
    console.print(f"started: {', '.join(started) or 'nothing, it runs'}; Web UI and --jobmanager: http://{cluster.address}")


@flink_app.command("status")
def flink_status() -> None:
    """Show the JobManager's and each TaskManager's state, address, pid and log."""
    from loopline.components import flink_session

    console.print(stack_table(flink_session(settings()).status()))


@flink_app.command("down")
def flink_down() -> None:
    """Stop every TaskManager, then the JobManager (running jobs stop; their retained checkpoints stay)."""
    from loopline.components import flink_session

    stopped = flink_session(settings()).down()
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


JobManagerOption = Annotated[
    str | None, typer.Option("--jobmanager", help="REST host:port of a Flink cluster (default: embedded).")
]


ParallelismOption = Annotated[int | None, typer.Option(min=1, help="The job's parallelism (default: its settings').")]
FromSavepointOption = Annotated[
    str | None, typer.Option(help="With --jobmanager: restore this savepoint or retained checkpoint (any Flink filesystem URI).")
]
PrintCommandOption = Annotated[
    bool, typer.Option(help="With --jobmanager: print the `flink run` command (for a FlinkDeployment's args), submit nothing.")
]
ImageOption = Annotated[
    bool,
    typer.Option(
        help="With --jobmanager: the job as a Loopline Flink image runs it (its Python and jars, settings from "
        "the environment where it runs; a FlinkDeployment's form), shipping nothing."
    ),
]


def _image(image: bool) -> FlinkImage | None:
    """The layout of a Loopline Flink image when the job runs in one (``--image``)."""
    from streams.flink_submit import FlinkImage

    return FlinkImage() if image else None


def _submit_to_cluster(submission: Submission, jobmanager: str, print_command: bool) -> None:
    """Print the submission's command (one shell line, unwrapped), or submit it and say which job it made."""
    import shlex

    from loopline.cluster_jobs import submit

    if print_command:
        print(shlex.join(submission.command))
        return
    console.print(f"submitted to {jobmanager}: job {submit(submission, jobmanager)}", soft_wrap=True)


@stream_app.command("submit")
def stream_submit(
    jobmanager: JobManagerOption = None,
    restore: Annotated[
        bool,
        typer.Option(help="Resume from the newest checkpoint; --no-restore rebuilds the state from the oldest retained event."),
    ] = True,
    from_time: Annotated[
        str | None,
        typer.Option(help="With --no-restore: rebuild from the events published since this ISO-8601 time instead."),
    ] = None,
    parallelism: ParallelismOption = None,
    from_savepoint: FromSavepointOption = None,
    print_command: PrintCommandOption = False,
    image: ImageOption = False,
) -> None:
    """Run the feature job: on the embedded mini-cluster (until stopped), or submitted to a cluster with its code,
    Python environment, jars and settings."""
    from loopline.components import feature_plan, job_settings

    if from_time is not None and restore:
        raise typer.BadParameter("--from-time rebuilds the state from the log: use it with --no-restore")
    if jobmanager is None and (from_savepoint or print_command or image):
        raise typer.BadParameter("--from-savepoint, --print-command and --image are for a cluster: give --jobmanager")
    config = settings()
    if jobmanager is not None:
        from loopline.cluster_jobs import feature_job_submission

        if from_savepoint is not None and not restore:
            raise typer.BadParameter("--from-savepoint restores that savepoint: leave out --no-restore")
        if image and not restore:
            raise typer.BadParameter("a FlinkDeployment's job starts as its upgradeMode says: --no-restore is for a shipped job")
        submission = feature_job_submission(
            config, jobmanager, parallelism, from_savepoint, restore, _image(image), _epoch_ms(from_time)
        )
        _submit_to_cluster(submission, jobmanager, print_command)
        return
    from streams.feature_job import run_embedded

    plan = feature_plan(config)
    console.print(f"feature job: {', '.join(v.name for v in plan.views)} from {', '.join(plan.topics)}")
    job = dataclasses.replace(
        job_settings(config), start_from_ms=_epoch_ms(from_time), parallelism=parallelism or config.stream.parallelism
    )
    run_embedded(plan, job, restore=restore)


@stream_app.command("status")
def stream_status(jobmanager: JobManagerOption = None) -> None:
    """Show the jobs of a Flink cluster."""
    from infra.flink_cluster import list_jobs
    from loopline.tables import flink_jobs_table

    if jobmanager is None:
        console.print("the embedded job lives inside its `loopline stream submit` process; give --jobmanager for a cluster")
        return
    console.print(flink_jobs_table(list_jobs(jobmanager), jobmanager))


@stream_app.command("cancel")
def stream_cancel(
    jobmanager: Annotated[str, typer.Option("--jobmanager", help="REST host:port of the Flink cluster.")],
    job_id: Annotated[str | None, typer.Argument(help="Default: every running loopline-features job.")] = None,
) -> None:
    """Cancel the feature job on a Flink cluster (its retained checkpoints stay)."""
    _stop_feature_job(jobmanager, job_id, savepoint=False)


@stream_app.command("stop")
def stream_stop(
    jobmanager: Annotated[str, typer.Option("--jobmanager", help="REST host:port of the Flink cluster.")],
    savepoint: Annotated[bool, typer.Option(help="Take a savepoint under stream.checkpoint_dir; --no-savepoint cancels.")] = True,
    job_id: Annotated[str | None, typer.Argument(help="Default: every running loopline-features job.")] = None,
) -> None:
    """Stop the feature job on a Flink cluster with a savepoint; `stream submit --from-savepoint` resumes from it (at
    any --parallelism)."""
    _stop_feature_job(jobmanager, job_id, savepoint)


def _stop_feature_job(jobmanager: str, job_id: str | None, savepoint: bool) -> None:
    from loopline.cluster_jobs import running_jobs, stop_job
    from streams.job_settings import JOB_NAME

    targets = [job_id] if job_id else running_jobs(jobmanager, JOB_NAME)
    for target in targets:
        location = stop_job(jobmanager, target, settings() if savepoint else None)
        console.print(
            f"stopped {target} with savepoint {location}" if location else f"cancelling {target}", highlight=False, soft_wrap=True
        )
    if not targets:
        console.print("no running feature job")


@topics_app.command("apply")
def topics_apply() -> None:
    """Create or update the project's topics and Loopline's own from their specs (idempotent)."""
    console.print(topics_table(apply_loopline_topics(settings())))


@schemas_app.command("check")
def schemas_check() -> None:
    """Fail if an event contract of the project, or a record of Loopline's own, changed in a way that breaks existing
    readers or events already written."""
    from schemas.compatibility import check_project_contracts

    for name, outcome in {**check_project_contracts(project(settings())), **check_registered_schemas()}.items():
        console.print(f"{name}: {outcome}")


@schemas_app.command("register")
def schemas_register() -> None:
    """Record the project's current contracts as registered (under contracts/registered/), refused if a change is
    breaking."""
    from schemas.compatibility import register_project_contracts

    for path in register_project_contracts(project(settings())):
        console.print(f"registered {path}")


@app.command("produce")
def produce(
    rate: Annotated[float, typer.Option(help="Events per second (average; a world's bursts may go above).")] = 1000.0,
    duration: Annotated[float, typer.Option(help="Seconds of stream time to publish.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Same seed and start: the same events.")] = 7,
    start: Annotated[str, typer.Option(help="Stream start time, ISO-8601 or 'now'.")] = "now",
    malformed_rate: Annotated[float | None, typer.Option(help="Share of deliberately broken records.")] = None,
) -> None:
    """Publish the project's synthetic world (its events, late and out of order ones among them, and labels)."""
    stats = produce_stream(settings(), rate, duration, seed, start, console, malformed_rate)
    console.print(json.dumps({"delivered": dict(stats.delivered), "seconds": round(stats.seconds, 2)}))


@app.command("serve")
def serve(
    model: Annotated[Path | None, typer.Option(help="Serve this ONNX file (default: the model registry's prod/canary).")] = None,
    http: Annotated[bool, typer.Option(help="POST /v1/score, GET /v1/models/status|ready, /metrics.")] = True,
    kafka: Annotated[
        bool,
        typer.Option(help="scoring.requests -> scoring.predictions, exactly once (or at least once: serving.kafka_delivery)."),
    ] = False,
    grpc: Annotated[bool, typer.Option(help="loopline.scoring.v1.Scorer/Score (schemas/scoring.proto).")] = False,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Processes sharing the ports (default: serving.workers, else one per core).")
    ] = None,
    worker_index: Annotated[int | None, typer.Option(hidden=True, help="Set by the supervisor for each worker.")] = None,
) -> None:
    """Serve the scorer through its front doors until interrupted, hot-swapping the model registry's versions."""
    from loopline.serve_workers import WorkerSupervisor
    from loopline.serving import serve as run

    config = settings()
    path = model or config.serving.model_path
    if path is not None and not path.exists():
        raise StackError(f"no model file at {path}", "pass an existing --model PATH, or none to serve from the model registry")
    doors = {door for door, chosen in (("http", http), ("kafka", kafka), ("grpc", grpc)) if chosen}
    if not doors:
        raise StackError("no front door chosen", "pass --http, --kafka and/or --grpc")
    serving = config.serving
    where = {
        "http": f"http://{serving.host}:{serving.http_port}",
        "grpc": f"grpc {serving.host}:{serving.grpc_port}",
        "kafka": "Kafka scoring.requests",
    }
    count = workers or serving.workers or len(os.sched_getaffinity(0))
    if worker_index is not None:
        run(config, path, doors, worker=(worker_index, count))
        return
    source = path or f"{serving.model_name}@prod/canary from {config.tracking_uri}"
    console.print(f"scoring with {source} on {', '.join(where[d] for d in sorted(doors))}, {count} worker{'s' * (count > 1)}")
    if count == 1:
        run(config, path, doors)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    arguments = [
        *(["--model", str(path)] if path is not None else []),
        *(f"--{'' if chosen else 'no-'}{door}" for door, chosen in (("http", http), ("kafka", kafka), ("grpc", grpc))),
    ]
    raise typer.Exit(WorkerSupervisor(config, arguments, count).run())


ModelNameOption = Annotated[str | None, typer.Option(help="Registered model name (default: serving.model_name).")]


def _release(name: str | None) -> tuple[ModelRelease, str]:
    """The settings' model registry, and the model name to act on."""
    from loopline.components import model_release

    config = settings()
    return model_release(config), name or config.serving.model_name


def _actor() -> str:
    """Who makes a release step from the CLI, for the alias history."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's user without a passwd entry or $USER
        user = "unknown user"
    return f"{user} (loopline CLI)"


@models_app.command("register")
def models_register(
    path: Annotated[Path, typer.Argument(help="The ONNX file (schemas/model_contract.py).", exists=True, dir_okay=False)],
    alias: Annotated[str | None, typer.Option(help="Point this alias (prod, canary) at the new version.")] = None,
    name: ModelNameOption = None,
) -> None:
    """Register a model file as a new version, its SHA-256 recorded for serving to verify. A model trained elsewhere is
    checked first as the project would serve it (online/model_admission.py): in the model contract, its inputs the
    project's features and request fields with their kinds, finite scores (probabilities for a binary label)."""
    from online.model_admission import ModelRejected, admit_model

    declared = project(settings())
    try:
        inputs = admit_model(path, declared.feature_repo, declared.labels.kind)
    except ModelRejected as err:
        raise typer.BadParameter(str(err), param_hint="PATH") from None
    release, name = _release(name)
    version = release.register(name, path)
    console.print(
        f"{len(inputs)} inputs, as the {declared.name} project declares them: "
        + ", ".join(f"{i.name} ({i.kind})" for i in inputs),
        highlight=False,
    )
    if alias:
        release.set_alias(name, alias, version, _actor(), "registered with --alias")
    console.print(f"registered {name} v{version}" + (f" as {alias}" if alias else ""))


@models_app.command("first")
def models_first(
    alias: Annotated[str | None, typer.Option(help="Point this alias at it.")] = PROD_ALIAS,
    name: ModelNameOption = None,
) -> None:
    """Register the project's hand-set first model (model.first_model in loopline_project.yaml: a weight per input and
    a bias) as a new version, prod by default: something to serve, and to log features with, before any training."""
    from loopline.project import write_first_model

    config = settings()
    declared = project(config)
    path = write_first_model(declared, config.home.absolute() / "models" / f"{declared.name}-first.onnx")
    models_register(path, alias, name)


@models_app.command("promote")
def models_promote(
    version: Annotated[str, typer.Argument(help="The version to serve as prod.")],
    reason: Annotated[str, typer.Option(help="Why, for the alias history.")] = "promoted by hand",
    name: ModelNameOption = None,
) -> None:
    """Point prod at VERSION (scorers hot-swap at their next poll) and end any canary."""
    release, name = _release(name)
    release.promote(name, version, _actor(), reason)
    console.print(f"{name} prod → v{version}")


@models_app.command("canary")
def models_canary(
    version: Annotated[str, typer.Argument(help="The version to try on part of the traffic.")],
    share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of requests (by request-id hash).")] = 0.1,
    name: ModelNameOption = None,
) -> None:
    """Send SHARE of the traffic to VERSION (alias canary)."""
    release, name = _release(name)
    release.start_canary(name, version, share, _actor())
    console.print(f"{name} canary → v{version} on {share:.0%} of requests")


@models_app.command("history")
def models_history(name: ModelNameOption = None) -> None:
    """Every alias change: when, who or what, which alias, from which version to which, and why."""
    release, name = _release(name)
    console.print(alias_history_table(release.history(name), title=f"{name}: alias history"))


@app.command("release")
def release(
    target: Annotated[str, typer.Argument(help="A VERSION to release as a canary, or `watch`.")],
    canary: Annotated[float, typer.Option(min=0.0, max=100.0, help="Percent of requests the canary takes.")] = 5.0,
    once: Annotated[bool, typer.Option(help="watch: look once and apply the verdict, then stop.")] = False,
    name: ModelNameOption = None,
) -> None:
    """`loopline release VERSION --canary 5` sends 5 % of requests to VERSION; `loopline release watch` watches the
    canary against prod (the scorers' metrics, labeled feedback) until the policy promotes or rolls it back."""
    if target != "watch":
        model_release, name = _release(name)
        model_release.start_canary(name, target, canary / 100, _actor(), f"released as a canary on {canary:g} % of requests")
        console.print(f"{name} v{target} is the canary on {canary:g} % of requests; `loopline release watch` decides")
        return
    from loopline.components import release_controller

    config = settings()
    controller = release_controller(config)
    while True:
        outcome = controller.step()
        if outcome is None:
            console.print("no canary is out")
            return
        decision, canary_stats, prod_stats = outcome
        console.print(release_step_line(decision, canary_stats, prod_stats, controller.policy.quality), highlight=False)
        if once or decision.action != "wait":
            return
        time.sleep(config.release.poll_s)


@app.command("rollback")
def rollback(
    reason: Annotated[str, typer.Option(help="Why, for the alias history.")] = "rolled back by hand",
    name: ModelNameOption = None,
) -> None:
    """Point prod back at the version it replaced (and end any canary), in one command."""
    release, name = _release(name)
    version = release.rollback(name, _actor(), reason)
    console.print(f"{name} prod → v{version} (rolled back)")


feedback_app = typer.Typer(help="The feedback loop: predictions joined with late labels into training examples.")
app.add_typer(feedback_app, name="feedback")
snapshot_app = typer.Typer(help="Versioned training snapshots (parquet + manifest, content-addressed).")
app.add_typer(snapshot_app, name="snapshot")


@feedback_app.command("join")
def feedback_join(
    restore: Annotated[
        bool, typer.Option(help="Resume from the newest checkpoint; --no-restore starts from the group's offsets.")
    ] = True,
    jobmanager: JobManagerOption = None,
    parallelism: ParallelismOption = None,
    from_savepoint: FromSavepointOption = None,
    print_command: PrintCommandOption = False,
    image: ImageOption = False,
) -> None:
    """Run the feedback joiner (PyFlink): scoring.predictions ⋈ the project's labels → training.examples, embedded (until
    stopped) or submitted to a cluster with its code, Python environment, jars and settings."""
    from loopline.components import joiner_settings

    if jobmanager is None and (from_savepoint or print_command or image):
        raise typer.BadParameter("--from-savepoint, --print-command and --image are for a cluster: give --jobmanager")
    config = settings()
    if jobmanager is not None:
        from loopline.cluster_jobs import joiner_submission

        _submit_to_cluster(
            joiner_submission(config, jobmanager, parallelism, from_savepoint, restore, _image(image)), jobmanager, print_command
        )
        return
    from feedback_loop.joiner_job import run_embedded

    console.print(f"feedback joiner: horizon {config.feedback.horizon_s:,.0f} s, group {config.feedback.group_id}")
    job = dataclasses.replace(joiner_settings(config), parallelism=parallelism or config.feedback.parallelism)
    run_embedded(job, restore=restore)


def _epoch_ms(text: str | None) -> int | None:
    """An ISO-8601 time (UTC unless it says otherwise) as epoch milliseconds."""
    if text is None:
        return None
    from datetime import datetime

    moment = datetime.fromisoformat(text)
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


@snapshot_app.command("create")
def snapshot_create(
    start: Annotated[str | None, typer.Option("--from", help="Examples scored from this time (ISO-8601, UTC).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="... up to (not including) this time.")] = None,
    backfill: Annotated[
        bool, typer.Option(help="Build examples from the event log (recompute), not from logged predictions.")
    ] = False,
    model: Annotated[str | None, typer.Option(help="Only this model's logged examples (default: every model's).")] = None,
) -> None:
    """Write an immutable snapshot of labeled examples; print its manifest summary."""
    from loopline.retraining import create_snapshot

    manifest = create_snapshot(settings(), _epoch_ms(start), _epoch_ms(end), backfill=backfill, model_name=model)
    console.print(snapshot_table([manifest], title="snapshot"))


@snapshot_app.command("backfill")
def snapshot_backfill(
    snapshot_id: Annotated[str, typer.Argument(help="The snapshot to extend (a unique prefix will do).")],
    feature: Annotated[list[str], typer.Option("--feature", help="A feature added since (view:feature); repeat for more.")],
) -> None:
    """A new snapshot: the snapshot's examples with features added since, each as of its request's time, recomputed
    from the retained events with the stream's window semantics."""
    from loopline.retraining import backfill_snapshot

    manifest = backfill_snapshot(settings(), snapshot_id, feature, console)
    console.print(snapshot_table([manifest], title=f"snapshot {snapshot_id} with {', '.join(feature)}"))


@snapshot_app.command("list")
def snapshot_list() -> None:
    """Every snapshot, oldest first."""
    from feedback_loop.snapshots import list_snapshots

    console.print(snapshot_table(list_snapshots(settings().snapshots_root), title=f"snapshots in {settings().snapshots_root}"))


@snapshot_app.command("show")
def snapshot_show(snapshot_id: Annotated[str, typer.Argument(help="A snapshot id (a unique prefix will do).")]) -> None:
    """A snapshot's manifest."""
    from feedback_loop.snapshots import find_snapshot

    manifest, folder = find_snapshot(settings().snapshots_root, snapshot_id)
    console.print(f"{folder}")
    console.print_json(manifest.to_json())


@snapshot_app.command("diff")
def snapshot_diff(
    a: Annotated[str, typer.Argument(help="The reference snapshot.")], b: Annotated[str, typer.Argument(help="The other.")]
) -> None:
    """How snapshot B differs from A: rows, labels, features, and each feature's drift (PSI on A's bins)."""
    from feedback_loop.snapshots import diff_snapshots

    console.print(snapshot_diff_table(diff_snapshots(settings().snapshots_root, a, b)))


@app.command("train")
def train(
    snapshot: Annotated[str, typer.Option(help="The snapshot id to train on.")],
    resume: Annotated[bool, typer.Option(help="Continue the last run on this snapshot from its newest checkpoint.")] = False,
    processes: Annotated[
        int | None,
        typer.Option(help="Training processes per node (default feedback.train_processes; unset: one per visible GPU, else 2)."),
    ] = None,
    quantize: Annotated[bool | None, typer.Option(help="Also try dynamic INT8 (default retrain.quantize).")] = None,
    canary: Annotated[float | None, typer.Option(min=0.0, max=100.0, help="A canary on PCT % of requests.")] = None,
    owner: Annotated[str | None, typer.Option(help="Who answers for the model, on its card (default retrain.owner).")] = None,
    nnodes: Annotated[int, typer.Option(help="Training nodes: run this command on each, with its --node-rank.")] = 1,
    node_rank: Annotated[
        int, typer.Option(help="This node, 0..nnodes-1; node 0 serves the rendezvous, judges and registers.")
    ] = 0,
    rdzv: Annotated[str | None, typer.Option(help="HOST:PORT where the nodes meet (torchrun's c10d): node 0's address.")] = None,
) -> None:
    """Train on a snapshot with DeepSpeed (torchrun; on one node or, with --nnodes, several sharing feedback.train_dir),
    compare with prod on the same holdout rows, write the model card, register the model if it is not worse than prod,
    and with --canary release it on part of the traffic."""
    from loopline.retraining import retrain, train_on_snapshot

    if node_rank > 0:  # the model the nodes trained together is judged and registered once, by node 0
        metrics = train_on_snapshot(
            settings(), snapshot, resume=resume, processes=processes, nnodes=nnodes, node_rank=node_rank, rdzv=rdzv
        )
        console.print(
            f"node {node_rank} of {nnodes} done; node 0 judges and registers the model ({metrics.parent})", highlight=False
        )
        return
    reason = f"loopline train --canary {canary:g}" if canary else ""
    outcome = retrain(
        settings(),
        snapshot,
        resume=resume,
        processes=processes,
        quantize=quantize,
        canary_percent=canary,
        actor=_actor(),
        reason=reason,
        owner=owner,
        nnodes=nnodes,
        rdzv=rdzv,
    )
    _print_outcome(outcome, canary)


def _print_outcome(outcome: RetrainOutcome, canary_requested: float | None) -> None:
    """The candidate against prod (table), whether it was registered and why, INT8's verdict, the canary, the card."""
    from loopline.tables import candidate_table

    report = outcome.report
    console.print(candidate_table(report, outcome.name))
    quantization = report.quantization
    if quantization is not None:
        console.print(
            f"INT8 {'kept' if quantization.kept else 'refused'}: {quantization.reason}; latency gain "
            f"×{quantization.latency_gain:.2f} (fp32 median ÷ INT8 median)",
            highlight=False,
        )
    if report.version is None:
        console.print(f"[red]not registered[/red]: {report.verdict.reason}", highlight=False)
    else:
        console.print(f"[green]registered {outcome.name} v{report.version}[/green]: {report.verdict.reason}", highlight=False)
    if outcome.canary_percent is not None:
        console.print(
            f"v{report.version} is the canary on {outcome.canary_percent:g} % of requests; `loopline release watch` decides"
        )
    elif canary_requested and report.version is not None:
        console.print(
            f"no canary: there is no prod to compare v{report.version} with; `loopline models promote {report.version}` serves it"
        )
    console.print(f"model card: {report.card_path}", highlight=False)


retrain_app = typer.Typer(
    help="The retrain trigger: retrain when prod's labeled quality falls or a skew or consistency alert fires (retrain.*)."
)
app.add_typer(retrain_app, name="retrain")


@retrain_app.command("watch")
def retrain_watch(once: Annotated[bool, typer.Option(help="Look once (and act on it), then stop.")] = False) -> None:
    """Judge prod on the labeled examples of the last retrain.window_s, and look for its skew and consistency alerts in
    Prometheus, every retrain.poll_s; when its quality falls or an alert fires, print why (notify) or also snapshot,
    train, evaluate and release the new version as a canary (retrain): retrain.mode for quality, retrain.alert_mode for
    alerts."""
    from loopline.retraining import TrainJobStarted, trigger_step

    config = settings()
    if config.retrain.mode == config.retrain.alert_mode == "off":
        console.print(
            "the retrain trigger is off: set retrain.mode (labeled quality) or retrain.alert_mode (skew and "
            "consistency alerts) to notify or retrain (LOOPLINE_RETRAIN__MODE, LOOPLINE_RETRAIN__ALERT_MODE)"
        )
        return
    from infra.prometheus_server import alert_names

    unknown = sorted(set(config.retrain.alerts) - alert_names())
    if config.retrain.alert_mode != "off" and unknown:
        raise typer.BadParameter(
            f"retrain.alerts names no rule under infra/prometheus/: {', '.join(unknown)} "
            f"(the rules' alerts: {', '.join(sorted(alert_names()))})"
        )
    # SIGTERM (a pod's stop) ends the watch between looks, never inside one (a retraining or a TrainJob's creation).
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        decision, outcome = trigger_step(config)
        verdict = f"[red]fire[/red] ({config.retrain.mode_for(decision.causes)})" if decision.fire else "quiet"
        console.print(f"{time.strftime('%H:%M:%S')} {verdict}: {decision.reason}", highlight=False)
        if isinstance(outcome, TrainJobStarted):
            job = outcome.trainjob
            console.print(
                f"TrainJob {job.namespace}/{job.name} {'created' if job.created else 'already created'} on snapshot "
                f"{outcome.snapshot_id}: `kubectl get trainjob {job.name}` follows it",
                highlight=False,
            )
        elif outcome is not None:
            _print_outcome(outcome, config.retrain.canary_percent)
        if once:
            return
        stop.wait(config.retrain.poll_s)


@app.command("monitor")
def monitor() -> None:
    """Watch the prediction log for feature skew against the reference snapshot and replay a sample against the offline
    recompute; Prometheus metrics on monitor.metrics_port. Runs until SIGTERM."""
    from prometheus_client import start_http_server

    from feedback_loop.monitor_metrics import MonitorMetrics
    from loopline.monitoring import build_monitor, wait_for_reference

    config = settings()
    metrics = MonitorMetrics()
    start_http_server(config.monitor.metrics_port, addr=config.serving.host, registry=metrics.collector_registry)
    wait_for_reference(config, lambda err: console.print(f"monitor: waiting for a reference snapshot: {err}"))
    monitor = build_monitor(config, metrics)
    console.print(
        f"monitor: skew against snapshot {monitor.window.reference_id}, metrics on "
        f"http://{config.serving.host}:{config.monitor.metrics_port}/metrics"
    )
    monitor.run()


@app.command("dashboard")
def dashboard() -> None:
    """Serve the skew alert dashboard: features' skew and consistency, alerts firing, model versions, scorer latency."""
    import uvicorn

    from infra.dashboard_server import dashboard_app
    from loopline.monitoring import model_versions

    config = settings()
    page = dashboard_app(
        f"http://{config.prometheus.host}:{config.prometheus.port}",
        lambda: model_versions(config),
        config.jaeger.query_url,
        config.serving.tracing.service_name,
    )
    console.print(
        f"dashboard: http://{config.dashboard.host}:{config.dashboard.port}/ (Prometheus at "
        f"http://{config.prometheus.host}:{config.prometheus.port}, Jaeger at {config.jaeger.query_url})"
    )
    uvicorn.run(page, host=config.dashboard.host, port=config.dashboard.port, log_level="warning")


@app.command("plan-gpu")
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
    console.print(
        f"{shape.kind}: {shape.parameters / 1e6:,.1f} M parameters; training in {precision} with Adam, micro-batch {batch}"
    )
    memory, fewest, serving = gpu_plan_tables(shape, precision, serve_precision, batch, seq_len, serve_batch, recompute)
    console.print(memory, fewest)
    console.print(serving)


@app.command("demo")
def demo(
    seconds: Annotated[
        float,
        typer.Option(help="Rough total run time (the demo goes on, bounded, until the loop closes).", envvar="DEMO_SECONDS"),
    ] = 300.0,
    rate: Annotated[
        float,
        typer.Option(
            help="Events per second of the world, each scored event scored (the feature job alone keeps up with thousands)."
        ),
    ] = 100.0,
    template: Annotated[
        str | None,
        typer.Option(
            help="Run this template's world (fraud, delivery) in a project of its own under "
            "the home; default: the project here, else fraud."
        ),
    ] = None,
) -> None:
    """Run the loop end to end on the local stack and print a summary; the stack stays up. Exit code 1 when a promise
    was not kept (a step of the loop failed, or the alerts do not match the injected skew)."""
    from loopline.project import instance_of_template
    from loopline.scenarios.demo import run_demo
    from schemas.project import find_project

    config = settings()
    if template is not None or (config.project is None and find_project(Path.cwd()) is None):
        config = settings(project=instance_of_template(config.home, template or "fraud"))
    failures = run_demo(config, seconds=seconds, rate=rate, console=console)
    if failures:
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error:[/red] the demo did not keep {len(failures)} promise(s): " + "; ".join(failures), highlight=False
        )
        raise typer.Exit(1)


def main() -> None:
    """Console entry point: user errors are one line on stderr and exit code 1."""
    try:
        app()
    except USER_ERRORS as err:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {_one_line(err)}", highlight=False)
        sys.exit(1)


def _one_line(err: Exception) -> str:
    """A user error as one line: a settings error by its messages (each names the setting and the fix)."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"] for e in err.errors())
    if isinstance(err, urllib.error.URLError):
        return f"the Flink cluster's REST API refused or did not answer ({getattr(err, 'reason', err)}) — fix: check --jobmanager and the job id, `loopline flink status`"
    return str(err)
