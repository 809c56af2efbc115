"""Builds Loopline's components from settings (the only place settings meet components)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.settings import FeatureStoreSettings, RedisSettings
from feedback_loop.joiner_settings import JoinerSettings, plain_label
from feedback_loop.settings import FeedbackSettings, MonitorSettings
from infra.flink import FlinkRuntime
from infra.jaeger import JaegerServer, jaeger_binary
from infra.jars import flink_connector_jar, operator_libraries
from infra.kafka_cluster import KafkaCluster
from infra.prometheus_server import PrometheusServer
from infra.redis import RedisServer
from infra.redis_cluster import RedisCluster
from infra.service import free_port_block, free_ports
from infra.settings import JaegerSettings, PrometheusSettings
from infra.stack import LocalStack
from loopline.project import loaded_project
from loopline.settings import Settings
from schemas.kafka_settings import KafkaSettings
from schemas.project import Project
from schemas.topics import TOPICS
from streams.feature_plan import FeaturePlan, registered_plan
from streams.job_settings import JobSettings
from streams.operators_jar import operators_jar
from streams.settings import StreamSettings
from streams.topics import TopicChange, apply_topics
from streams.world import WorldConfig

if TYPE_CHECKING:
    from infra.flink_session import FlinkSessionCluster
    from offline_training.release import ModelRelease
    from offline_training.release_controller import ReleaseController
    from online.model_registry_reader import ModelRegistryReader
    from streams.flink_submit import FlinkImage, JobArchives


def private_stack_settings(home: Path, jars_dir: Path, project_path: Path | None = None, kafka_brokers: int = 1) -> Settings:
    """Settings for a stack of its own under ``home``, Kafka (``kafka_brokers`` nodes, topics replicated on up to three
    of them), Redis, Prometheus and metrics on free ports, for the project at ``project_path`` (tests, benchmarks)."""
    redis, prometheus, monitor, stream, feedback, otlp, query, query_grpc, health = free_ports(9)
    # Node i listens on port + 2i and its controller on controller_port + 2i: one block of free ports for all.
    kafka = free_port_block(2 * kafka_brokers)
    return Settings(
        project=project_path,
        home=home,
        jars_dir=jars_dir,
        kafka=KafkaSettings(port=kafka, controller_port=kafka + 1, brokers=kafka_brokers),
        redis=RedisSettings(port=redis),
        prometheus=PrometheusSettings(port=prometheus),
        jaeger=JaegerSettings(otlp_port=otlp, query_port=query, query_grpc_port=query_grpc, health_port=health),
        monitor=MonitorSettings(metrics_port=monitor),
        feature_store=FeatureStoreSettings(feast_registry_path=home / "feast" / "registry.db"),
        stream=StreamSettings(metrics_port=stream),
        feedback=FeedbackSettings(metrics_port=feedback),
    )


def build_stack(settings: Settings) -> LocalStack:
    """The local stack configured by ``settings``."""
    data, logs, run, jars = (
        settings.resolved_data_dir,
        settings.resolved_logs_dir,
        settings.run_dir,
        settings.resolved_jars_dir,
    )
    kafka = KafkaCluster(
        brokers=settings.kafka.brokers,
        host=settings.kafka.host,
        port=settings.kafka.port,
        controller_port=settings.kafka.controller_port,
        data_dir=data,
        jars_dir=jars,
        run_dir=run,
        log_dir=logs,
        heap_mb=settings.kafka.heap_mb,
        start_timeout_s=settings.kafka.start_timeout_s,
    )
    redis = redis_service(settings.redis, data, run, logs)
    prometheus = PrometheusServer(
        host=settings.prometheus.host,
        port=settings.prometheus.port,
        targets=scrape_targets(settings),
        scrape_interval_s=settings.prometheus.scrape_interval_s,
        data_dir=data,
        run_dir=run,
        log_dir=logs,
        start_timeout_s=settings.prometheus.start_timeout_s,
    )
    jaeger = settings.jaeger
    tracing = JaegerServer(
        jaeger_binary(jars),
        jaeger.host,
        jaeger.otlp_port,
        jaeger.query_port,
        jaeger.query_grpc_port,
        jaeger.health_port,
        jaeger.max_traces,
        data,
        run,
        logs,
        jaeger.start_timeout_s,
    )
    # Every consumer group's checkpoints (<home>/checkpoints/<group>), the jobs' of earlier settings too.
    checkpoints = settings.checkpoints_root
    return LocalStack(kafka, redis, prometheus, tracing, FlinkRuntime(jars), jars, checkpoints)


def redis_service(redis: RedisSettings, data: Path, run: Path, logs: Path) -> RedisServer | RedisCluster:
    """The stack's Redis: one server, or with ``mode: cluster`` the masters and replicas of a Redis Cluster."""
    if redis.mode == "standalone":
        return RedisServer(redis.host, redis.port, data, run, logs, redis.start_timeout_s)
    return RedisCluster(
        redis.cluster_masters,
        redis.cluster_replicas,
        redis.host,
        redis.port,
        redis.cluster_bus_port,
        data,
        run,
        logs,
        redis.cluster_node_timeout_ms,
        redis.start_timeout_s,
    )


def project(settings: Settings) -> Project:
    """The project the settings name or the working directory holds (``loopline/project.py``)."""
    return loaded_project(settings.project_path)


def apply_loopline_topics(settings: Settings) -> list[TopicChange]:
    """The project's event topics and Loopline's own (``schemas/topics.py``) applied to the settings' Kafka, replicated
    as the settings say."""
    kafka = settings.kafka
    topics = (*project(settings).topics, *TOPICS)
    replication = kafka.replication
    return apply_topics(kafka.bootstrap, topics, kafka.client_config, replication.factor, replication.min_insync)


def scrape_targets(settings: Settings) -> dict[str, list[str]]:
    """What the stack's Prometheus scrapes, by job: the scorer, the monitor, the Flink jobs' reporters (when on)."""
    host = settings.serving.host
    targets = {
        "loopline-scorer": [f"{host}:{settings.serving.http_port}"],
        "loopline-monitor": [f"{host}:{settings.monitor.metrics_port}"],
    }
    if settings.stream.metrics_port:
        targets["loopline-feature-job"] = [f"127.0.0.1:{settings.stream.metrics_port}"]
    if settings.feedback.metrics_port:
        targets["loopline-joiner"] = [f"127.0.0.1:{settings.feedback.metrics_port}"]
    return targets


def world_config(settings: Settings, rate_per_s: float, malformed_rate: float | None = None) -> WorldConfig:
    """The synthetic world's knobs from settings, at ``rate_per_s``."""
    producer = settings.producer
    return WorldConfig(
        rate_per_s=rate_per_s,
        out_of_order_rate=producer.out_of_order_rate,
        max_out_of_order_s=producer.max_out_of_order_s,
        late_rate=producer.late_rate,
        malformed_rate=producer.malformed_rate if malformed_rate is None else malformed_rate,
        knobs=dict(producer.knobs),
    )


def world(settings: Settings, rate_per_s: float, seed: int, start_ms: int, malformed_rate: float | None = None, **config):
    """The project's synthetic world (``streams/world.py``) at ``rate_per_s`` from ``start_ms``; ``config`` replaces
    knobs of its ``WorldConfig`` (``label_delay_s``, ...)."""
    import dataclasses

    from loopline.project import world_class

    declared = project(settings)
    return world_class(declared)(
        declared, dataclasses.replace(world_config(settings, rate_per_s, malformed_rate), **config), seed, start_ms
    )


def feature_plan(settings: Settings) -> FeaturePlan:
    """The streaming plan compiled from the stream feature views in the project's Feast registry."""
    return registered_plan(
        project(settings), settings.feast_registry_path, settings.redis_connection, settings.stream.source_topics
    )


def feature_defaults(settings: Settings) -> dict[str, float | int | str | bool | None]:
    """The default each feature of the registry's views declares (``view:feature``): what the scorer falls back to."""
    from feature_store.config import feature_store
    from feature_store.defaults import declared_defaults

    store = feature_store(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=settings.redis_cluster
    )
    return declared_defaults([*store.list_feature_views(), *store.list_stream_feature_views()])


def feature_operators_jar(settings: Settings, folder: Path | None = None) -> Path:
    """The feature job's JVM operators (``streams/jvm``) in ``folder`` (default: the jar cache), compiled there if not
    there yet."""
    jars = settings.resolved_jars_dir
    return operators_jar(folder or jars / "loopline", operator_libraries(jars), flink_connector_jar(jars))


def joiner_operators_jar(settings: Settings, folder: Path | None = None) -> Path:
    """The joiner's JVM operators (``feedback_loop/jvm``, with the feature job's it keys with) in ``folder`` (default:
    the jar cache), compiled there if not there yet."""
    from feedback_loop.joiner_job import OPERATOR_SOURCES
    from streams.operators_jar import SOURCES

    jars = settings.resolved_jars_dir
    return operators_jar(
        folder or jars / "loopline",
        operator_libraries(jars),
        flink_connector_jar(jars),
        (SOURCES, OPERATOR_SOURCES),
        "loopline-feedback",
    )


def _connector_jar(settings: Settings, image: FlinkImage | None) -> Path:
    """The Kafka connector jar: in the jar cache, or in a Loopline Flink image's lib under the same name."""
    cached = flink_connector_jar(settings.resolved_jars_dir)
    return cached if image is None else image.lib / cached.name


def flink_session(settings: Settings, taskmanagers: int | None = None, slots: int | None = None) -> FlinkSessionCluster:
    """The standalone Flink session cluster of the settings (under ``<home>/flink``), with ``taskmanagers`` TaskManagers
    of ``slots`` slots each when given."""
    from infra.flink_session import FlinkSessionCluster

    flink = settings.flink
    return FlinkSessionCluster(
        settings.home.absolute() / "flink",
        flink.host,
        flink.rest_port,
        flink.rpc_port,
        taskmanagers or flink.taskmanagers,
        slots or flink.slots,
    )


def job_archives(settings: Settings) -> JobArchives:
    """What a job submitted to a cluster ships: the job environment (a venv over the TaskManagers' Python, built
    once and cached) and Loopline's code."""
    from streams.flink_submit import JobArchives
    from streams.job_archives import code_archive, environment_archive, pinned_requirements, python_version

    python = settings.flink.python
    return JobArchives(environment_archive(python, pinned_requirements(python_version(python))), code_archive())


def job_settings(settings: Settings, image: FlinkImage | None = None) -> JobSettings:
    """Everything the streaming job needs to know about the stack it runs on; with ``image``, running in a Loopline
    Flink image, whose lib holds its jars."""
    stream = settings.stream
    return JobSettings(
        bootstrap_servers=settings.kafka.bootstrap,
        connector_jar=_connector_jar(settings, image),
        operators_jar=feature_operators_jar(settings, image and image.lib),
        checkpoint_dir=settings.checkpoint_dir,
        project_path=settings.project_path,
        repo_path=settings.repo_path,
        source_topics=dict(stream.source_topics),
        feast_registry_path=settings.feast_registry_path,
        redis_connection=settings.redis_connection,
        redis_cluster=settings.redis_cluster,
        replica_acks=settings.redis.replica_acks,
        replica_ack_timeout_ms=settings.redis.write_ack_timeout_ms,
        kafka_properties=dict(settings.kafka.client_config),
        offline_dir=stream.offline_dir.absolute() if stream.offline_dir else None,
        group_id=stream.group_id,
        dead_letter_topic=stream.dead_letter_topic,
        checkpoint_interval_ms=stream.checkpoint_interval_ms,
        flush_interval_ms=stream.flush_interval_ms,
        max_batch_rows=stream.max_batch_rows,
        online_interval_ms=stream.online_interval_ms,
        state_check_ms=stream.state_check_ms,
        parallelism=stream.parallelism,
        metrics_port=stream.metrics_port,
        allow_partial_rebuild=stream.allow_partial_rebuild,
    )


def joiner_settings(settings: Settings, image: FlinkImage | None = None) -> JoinerSettings:
    """Everything the feedback joiner needs to know about the stack it runs on; with ``image``, running in a Loopline
    Flink image, whose lib holds its jars."""
    feedback = settings.feedback
    return JoinerSettings(
        predictions_topic=feedback.predictions_topic,
        label=plain_label(project(settings).labels, feedback.labels_topic),
        examples_topic=feedback.examples_topic,
        dead_letter_topic=feedback.dead_letter_topic,
        bootstrap_servers=settings.kafka.bootstrap,
        connector_jar=_connector_jar(settings, image),
        operators_jar=joiner_operators_jar(settings, image and image.lib),
        checkpoint_dir=settings.feedback_checkpoint_dir,
        horizon_ms=int(feedback.horizon_s * 1000),
        group_id=feedback.group_id,
        out_of_orderness_ms=feedback.out_of_orderness_ms,
        checkpoint_interval_ms=feedback.checkpoint_interval_ms,
        parallelism=feedback.parallelism,
        metrics_port=feedback.metrics_port or None,
        kafka_properties=dict(settings.kafka.client_config),
    )


def release_controller(settings: Settings) -> ReleaseController:
    """The release controller of the settings' model, reading the scorers' metrics and the labeled feedback."""
    from feedback_loop.example_log import logged_examples
    from offline_training.release_controller import ReleaseController

    release, kafka, serving = settings.release, settings.kafka, settings.serving
    policy = release.policy(project(settings).labels.kind)
    urls = release.metrics_urls or [f"http://{serving.host}:{serving.http_port}/metrics"]
    topic = settings.feedback.examples_topic

    def examples(since_ms: int):
        return logged_examples(kafka.bootstrap, topic, since_ms, None, kafka.client_config)[0]

    return ReleaseController(model_release(settings), serving.model_name, policy, urls, examples)


def _tracking_uri(settings: Settings) -> str:
    """The model registry's tracking URI, with the folder of the default local SQLite registry made."""
    # MLflow draws progress bars on artifact downloads (noise in a server's log), and its SQLite
    # store uses an SQLAlchemy loader option SQLAlchemy deprecated.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    warnings.filterwarnings("ignore", message="The ``noload`` loader strategy", category=DeprecationWarning)
    if settings.model_registry.tracking_uri is None:
        (settings.home / "mlflow").mkdir(parents=True, exist_ok=True)
    return settings.tracking_uri


def model_release(settings: Settings) -> ModelRelease:
    """Registers and releases model versions in the settings' model registry."""
    from offline_training.release import ModelRelease

    return ModelRelease(_tracking_uri(settings), settings.artifact_location)


def model_registry_reader(settings: Settings) -> ModelRegistryReader:
    """Serving's reader of the settings' registered model."""
    from online.model_registry_reader import ModelRegistryReader

    return ModelRegistryReader(_tracking_uri(settings), settings.serving.model_name)
