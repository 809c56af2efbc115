"""Loopline's one typed settings object.

Sources, highest priority first: constructor arguments, ``LOOPLINE_*`` environment variables
(nested with ``__``, e.g. ``LOOPLINE_KAFKA__PORT=19092``), the YAML file named by
``LOOPLINE_CONFIG`` (or ``loopline.yaml`` in the working directory when present), the project's
declarations (``_ProjectSource``), the remembered stack shape (``_StackShapeSource``), defaults.
Nested sections merge key by key: a higher source overrides the values it names and keeps the rest.
Only this package reads settings; components receive plain values.
"""

from __future__ import annotations

import difflib
import getpass
import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from feedback_loop.drift import SkewThresholds
from feedback_loop.joiner_settings import JoinerSettings
from feedback_loop.retrain_trigger import TriggerPolicy
from offline_training.release_policy import ReleasePolicy
from streams.job_settings import JobSettings

DEFAULT_CONFIG_FILE = Path("loopline.yaml")
#: Under the home: the shape `loopline stack up` gave the stack (``{"kafka": {"brokers": 3}}``), adopted by later
#: commands' settings beneath every explicit source, so `stack status`, `stack down` and every client see that stack.
STACK_SHAPE_FILE = "stack-shape.json"


def _comma_separated(value: Any) -> Any:
    """``"a:9092,b:9092"`` or ``'["a:9092", "b:9092"]'`` (an environment variable's forms) as a list; a list as it is."""
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            return json.loads(value)
        addresses = [part.strip() for part in value.split(",") if part.strip()]
        if value.strip() and not addresses:
            raise ValueError(f"{value!r} names no node: give host:port[,host:port...], or leave it unset for the stack's own")
        return addresses
    return value


class KafkaSettings(BaseModel):
    """Kafka: the stack's own KRaft nodes (combined broker + controller) or a cluster elsewhere
    (``bootstrap_servers``), and how Loopline's topics are replicated on it."""

    host: str = "127.0.0.1"
    port: int = Field(default=9092, ge=1, le=65535, description="The stack's first node; node i listens on port + 2i.")
    controller_port: int = Field(default=9093, ge=1, le=65535, description="The first node's controller; node i: + 2i.")
    brokers: int = Field(default=1, ge=1, le=9, description="How many nodes `loopline stack up` starts (--kafka-brokers).")
    bootstrap_servers: Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)] = Field(
        default_factory=list,
        description="host:port of a cluster's brokers (a list, or comma-separated); empty: the stack's own nodes.",
    )
    replication_factor: int = Field(default=1, ge=1, description="Replicas of each Loopline topic (3 at scale).")
    min_insync_replicas: int = Field(
        default=1, ge=1, description="Replicas an acks=all write needs (2 at scale, with replication_factor 3)."
    )
    heap_mb: int = Field(default=512, ge=128)
    start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a broker may take to answer: after a kill -9 "
        "it recovers its logs first (a node of 3 under load on 2 cores took 61 s in CI).",
    )
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every Loopline Kafka client and the Flink job's (security.protocol, sasl.*, ssl.*).",
    )

    @model_validator(mode="after")
    def _replicas_fit(self) -> KafkaSettings:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"kafka.min_insync_replicas ({self.min_insync_replicas}) exceeds kafka.replication_factor "
                f"({self.replication_factor}): no write could ever be acknowledged by all in-sync replicas"
            )
        if not self.bootstrap_servers and self.replication_factor > self.brokers:
            raise ValueError(
                f"kafka.replication_factor {self.replication_factor} needs as many brokers; the stack starts "
                f"{self.brokers} (set kafka.brokers, `stack up --kafka-brokers`, or kafka.bootstrap_servers)"
            )
        return self

    def node_ports(self) -> list[tuple[int, int]]:
        """(listener, controller) port of each of the stack's own nodes."""
        return [(self.port + 2 * i, self.controller_port + 2 * i) for i in range(self.brokers)]

    @property
    def bootstrap(self) -> str:
        """The comma-separated addresses every client connects to (librdkafka's and Flink's form)."""
        return ",".join(self.bootstrap_servers or [f"{self.host}:{port}" for port, _ in self.node_ports()])


class RedisSettings(BaseModel):
    """Redis, the Feast online store: the stack's own server, or a Redis Cluster of the stack's own nodes
    (``mode: cluster``, Feast's ``redis_type: redis_cluster``), or either elsewhere, named by its ``nodes``."""

    host: str = "127.0.0.1"
    port: int = Field(default=6379, ge=1, le=65535, description="The server's; in a cluster node i listens on port + i.")
    start_timeout_s: float = Field(default=20.0, gt=0)
    password: SecretStr | None = Field(default=None, description="For a Redis that requires AUTH.")
    ssl: bool = Field(default=False, description="Connect with TLS.")
    mode: Literal["standalone", "cluster"] = Field(default="standalone", description="cluster: Redis Cluster (--redis-cluster).")
    cluster_masters: int = Field(default=3, ge=3, le=16, description="Masters of the stack's cluster (Redis Cluster needs 3).")
    cluster_replicas: int = Field(default=1, ge=0, le=3, description="Replicas of each master: one takes over when it fails.")
    cluster_bus_port: int = Field(default=16379, ge=1, le=65535, description="Node i's cluster bus (node to node): + i.")
    cluster_node_timeout_ms: int = Field(
        default=5_000, ge=100, description="How long a master may not answer before the cluster fails it over to a replica."
    )
    nodes: Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)] = Field(
        default_factory=list,
        description="host:port of a Redis elsewhere: a cluster's nodes, any that answer (a list, or comma-separated); "
        "empty: the stack's own (host, port).",
    )
    write_acks: int | None = Field(
        default=None,
        ge=0,
        le=3,
        description="Replicas each batch of the feature job's rows must reach (Redis WAIT) before it counts as written, "
        "so a checkpoint completes only once its rows survive a failover; unset: the shape's (1 on the stack's own "
        "cluster with replicas, else 0; for a Redis elsewhere, set it to the replicas its masters have).",
    )
    write_ack_timeout_ms: int = Field(
        default=2_000,
        ge=1,
        description="How long a batch waits for those replicas; past it the write fails and the job restarts from its "
        "last checkpoint, writing the rows again.",
    )

    @model_validator(mode="after")
    def _acks_fit(self) -> RedisSettings:
        own = 0 if self.mode == "standalone" else self.cluster_replicas
        if not self.nodes and self.write_acks is not None and self.write_acks > own:
            raise ValueError(
                f"redis.write_acks {self.write_acks}: the stack's own Redis has {own} replica(s) per master, so no write "
                f"could ever be acknowledged (leave it unset, or raise redis.cluster_replicas with redis.mode cluster)"
            )
        return self

    @property
    def replica_acks(self) -> int:
        """How many replicas each of the feature job's row batches must reach: ``write_acks``, else the shape's."""
        if self.write_acks is not None:
            return self.write_acks
        return 1 if self.mode == "cluster" and not self.nodes and self.cluster_replicas > 0 else 0

    @property
    def node_ports(self) -> list[int]:
        """The client port of each of the stack's nodes: one server, or every master and replica of the cluster."""
        nodes = self.cluster_masters * (1 + self.cluster_replicas) if self.mode == "cluster" else 1
        return [self.port + i for i in range(nodes)]

    @property
    def addresses(self) -> list[str]:
        """host:port of every node the clients start from: ``nodes``, else the stack's own."""
        return self.nodes or [f"{self.host}:{port}" for port in self.node_ports]


class PrometheusSettings(BaseModel):
    """The local Prometheus (Debian's package): it scrapes every Loopline process and evaluates the alert rules."""

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=1, le=65535)
    scrape_interval_s: float = Field(default=5.0, gt=0, description="Also how often alert rules are evaluated.")
    start_timeout_s: float = Field(default=30.0, gt=0)


class JaegerSettings(BaseModel):
    """The local Jaeger (its all-in-one binary, built from the Go module proxy by `loopline stack setup`): it stores the
    scorer's request traces in memory and answers Jaeger's query API."""

    host: str = "127.0.0.1"
    otlp_port: int = Field(default=4318, ge=1, le=65535, description="Where it takes traces over OTLP/HTTP.")
    query_port: int = Field(default=16686, ge=1, le=65535, description="Its query API (/api/traces).")
    query_grpc_port: int = Field(default=16685, ge=1, le=65535)
    health_port: int = Field(default=13133, ge=1, le=65535, description="Its health check (/status).")
    max_traces: int = Field(default=100_000, ge=1, description="Traces it keeps in memory; the oldest go first.")
    start_timeout_s: float = Field(default=30.0, gt=0)

    @property
    def otlp_traces_url(self) -> str:
        return f"http://{self.host}:{self.otlp_port}/v1/traces"

    @property
    def query_url(self) -> str:
        return f"http://{self.host}:{self.query_port}"


class TracingSettings(BaseModel):
    """Request traces of the scorer (OpenTelemetry: ``online/tracing.py``)."""

    enabled: bool = Field(default=True, description="Off: no trace id, no span, nothing exported.")
    otlp_endpoint: str | None = Field(default=None, description="An OTLP/HTTP traces URL; default the local stack's Jaeger.")
    sample_ratio: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="The share of requests traced without a sampled "
        "caller (chosen by trace id); failed and slow requests are traced anyway.",
    )
    slow_ms: float = Field(
        default=50.0,
        gt=0,
        description="A request slower than this (the scorer's latency objective) is traced whatever the ratio.",
    )
    service_name: str = Field(default="loopline-scorer", description="The scorer's service.name in its traces.")


class DashboardSettings(BaseModel):
    """The skew alert dashboard (`loopline dashboard`)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8050, ge=1, le=65535)


class ProducerSettings(BaseModel):
    """Defaults of the project's synthetic world (``streams/world.py``) as `loopline produce` and the demo publish it."""

    out_of_order_rate: float = Field(default=0.05, ge=0, le=1)
    max_out_of_order_s: float = Field(default=5.0, ge=0)
    late_rate: float = Field(default=0.005, ge=0, le=1)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)
    knobs: dict[str, Any] = Field(
        default_factory=dict,
        description="The world's own knobs (the fraud world's users and "
        "merchants, the delivery world's restaurants and couriers).",
    )


class FeatureStoreSettings(BaseModel):
    """The project's Feast registry."""

    feast_registry_path: Path | None = Field(
        default=None,
        description="Default: the Feast registry the repo's feature_store.yaml names, which `feast` in the repo uses too.",
    )


class FlinkSettings(BaseModel):
    """The standalone Flink session cluster of `loopline flink up` (``infra/flink_session.py``) and what jobs submitted
    to a cluster bring (``streams/job_archives.py``)."""

    host: str = "127.0.0.1"
    rest_port: int = Field(default=8081, ge=1, le=65535, description="The JobManager's REST API and Web UI.")
    rpc_port: int = Field(default=6123, ge=1, le=65535)
    taskmanagers: int = Field(default=1, ge=1)
    slots: int = Field(default=2, ge=1, description="Task slots per TaskManager.")
    python: str = Field(
        default="/usr/bin/python3",
        description="The TaskManagers' Python (the same version as Loopline's, at "
        "this path on every one): the jobs' environment archive is a venv over it.",
    )


class StreamSettings(BaseModel):
    """The streaming feature job (its defaults are the job's own, ``streams/job_settings.py``)."""

    group_id: str = JobSettings.group_id
    source_topics: dict[str, str] = Field(
        default_factory=dict,
        description="Read these topics instead of the ones the project declares (declared -> read): a replay's, a test's.",
    )
    dead_letter_topic: str = JobSettings.dead_letter_topic
    checkpoint_interval_ms: int = Field(default=JobSettings.checkpoint_interval_ms, ge=100)
    flush_interval_ms: int = Field(
        default=JobSettings.flush_interval_ms,
        ge=1,
        description="Longest a row waits for a Python batch (decoding, the offline log): freshness.",
    )
    max_batch_rows: int = Field(
        default=JobSettings.max_batch_rows,
        ge=1,
        description="Rows per Python batch (Arrow), and entities per online write round trip: throughput.",
    )
    online_interval_ms: int = Field(
        default=JobSettings.online_interval_ms,
        ge=1,
        description="An entity's online row (with its windows' steps) goes at most once per this: freshness "
        "against work per event.",
    )
    state_check_ms: int = Field(
        default=JobSettings.state_check_ms,
        ge=1_000,
        description="The longest an entity waits between checks of whether its windows are empty for good (then it "
        "leaves the job's state): memory freed sooner against a check per entity per interval.",
    )
    parallelism: int = Field(default=JobSettings.parallelism, ge=1)
    allow_partial_rebuild: bool = Field(
        default=JobSettings.allow_partial_rebuild,
        description="Rebuild the windows even where a topic no longer retains a "
        "view's longest window (they count only what is retained, filling as new events come); else such a rebuild is refused.",
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="Checkpoints and savepoints: a path or any Flink filesystem "
        "URI (file:///shared/..., s3://bucket/... at scale); default <home>/checkpoints/<group_id>.",
    )
    offline_dir: Path | None = Field(
        default=None,
        description="Append feature rows under <dir>/<view>; default: the path each view's FileSource declares.",
    )
    metrics_port: int | None = Field(
        default=9249,
        ge=0,
        le=65535,
        description="The embedded job serves its Flink metrics to Prometheus at :<port>/metrics; 0 or None: off.",
    )


class LlmSettings(BaseModel):
    """An LLM served by vLLM (its OpenAI-compatible server, started by infra/vllm/serve.sh)."""

    base_url: str = Field(default="http://127.0.0.1:8000/v1", description="The vLLM server's OpenAI API.")
    served_model: str = Field(description="The model name the server serves (its --served-model-name).")
    inputs: list[str] = Field(min_length=1, description="Features ('view:feature') and request fields ('request:x').")
    prompt: str = Field(description="str.format template over the inputs by position: '{0}', '{1:.2f}', ...")
    answers: list[str] = Field(default=["yes", "no"], min_length=2, max_length=2, description="Score = P(first) / P(either).")
    max_concurrency: int = Field(default=32, ge=1, description="Completions in flight at once.")
    timeout_ms: float = Field(default=1000.0, gt=0, description="Longest a completion may take; then 'overloaded'.")


class RequestLimitSettings(BaseModel):
    """How large a score request may be, on every door."""

    max_body_bytes: int = Field(default=65_536, ge=256, description="Larger: HTTP 413, gRPC RESOURCE_EXHAUSTED, a dead letter.")
    max_entity_keys: int = Field(default=8, ge=1)
    max_request_fields: int = Field(default=64, ge=0)
    max_key_length: int = Field(default=256, ge=1, description="Request id, entity keys, field names and string values.")
    max_json_depth: int = Field(default=32, ge=2)
    max_ahead_s: float = Field(
        default=5.0,
        ge=0,
        description="A request stamped (requested_at_ms) further ahead of the scorer's clock is refused "
        "(HTTP 422, gRPC INVALID_ARGUMENT, a dead letter): its windows would be read as of a time no event has reached yet. "
        "Raise it to score what-if requests at later times.",
    )


class ServingSettings(BaseModel):
    """The online scorer (`loopline serve`)."""

    host: str = Field(default="127.0.0.1", description="Where the HTTP and gRPC doors listen.")
    http_port: int = Field(default=8080, ge=1, le=65535)
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    model_name: str = Field(
        default="model", description="The registered model to serve (its prod and canary aliases); default: the project's model."
    )
    model_path: Path | None = Field(default=None, description="Serve this ONNX file instead of the model registry's versions.")
    model_version: str = Field(default="file", description="The version a model_path file is reported as.")
    model_registry_poll_s: float = Field(
        default=5.0, gt=0, description="How often the scorer checks the model registry's aliases."
    )
    llm: LlmSettings | None = Field(default=None, description="Serve this LLM (vLLM) instead of ONNX models.")
    stale_after_s: float = Field(
        default=5.0,
        gt=0,
        description="A feature view whose job has absorbed its events up to more than this before both "
        "a request's time and the clock is read as of that progress, and its features are named stale in the prediction "
        "record (loopline_scoring_stale_features): its windows hold no later event yet.",
    )
    feature_budget_ms: float = Field(
        default=20.0, gt=0, description="Feature fetch budget; then defaults (default: the project's serving budget)."
    )
    max_batch_size: int = Field(default=64, ge=1, description="Requests per model call (the dynamic batcher).")
    feature_batch_size: int = Field(default=64, ge=1, description="Entities per pipelined Redis read of concurrent requests.")
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    max_queue_size: int = Field(default=1024, ge=1)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    result_cache_ttl_s: float | None = Field(default=None, gt=0, description="Cache scores in Redis this long; off when unset.")
    prediction_log: Literal["ack", "async", "off"] = Field(
        default="ack",
        description="HTTP/gRPC predictions to scoring.predictions: ack (the response waits for Kafka), async, or off.",
    )
    prediction_log_ack_timeout_s: float = Field(default=5.0, gt=0, description="ack mode: longer is a 503 to retry.")
    limits: RequestLimitSettings = RequestLimitSettings()
    auth_token: SecretStr | None = Field(default=None, description="Bearer token for scoring and model status (HTTP, gRPC).")
    auth_token_file: Path | None = Field(default=None, description="Read the bearer token from this file instead.")
    stall_after_s: float = Field(default=60.0, gt=0, description="A door holding work this long without progress fails liveness.")
    shutdown_timeout_s: float = Field(default=30.0, gt=0, description="After SIGTERM, exit by force after this long.")
    kafka_broker_timeout_s: float = Field(default=10.0, gt=0, description="Timeout of each broker call of the Kafka door.")
    kafka_delivery: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once",
        description="The Kafka door: exactly_once (predictions and offsets committed together in a transaction every "
        "kafka_commit_interval_ms) or at_least_once (each prediction sent at once, offsets committed past acknowledged ones; a "
        "crash may score a request twice, and readers count it once by request id).",
    )
    kafka_commit_interval_ms: float = Field(
        default=50.0,
        gt=0,
        description="How often the Kafka door commits. exactly_once: "
        "a transaction commits this long after its first scored chunk was handed over (a request waits for it); "
        "at_least_once: offsets past acknowledged records (a crash scores again at most "
        "what was acknowledged since).",
    )
    kafka_group_id: str = "loopline-scorer"
    instance: str = Field(
        default="0",
        description="This member's name: its Kafka transactional id is <group>-<instance> "
        "(<group>-<instance>-<worker> for each of several workers).",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Scorer processes sharing the HTTP and gRPC ports (loopline "
        "serve --workers); default one per core this process may run on.",
    )
    tracing: TracingSettings = TracingSettings()


def _mounted_path(value: Any) -> Any:
    """A folder training writes into: a path, never a URL (DeepSpeed saves checkpoints with ``torch.save``)."""
    if isinstance(value, str) and "://" in value:
        raise ValueError(
            f"{value!r} is a URL, and training writes its checkpoints to files: mount the bucket or share "
            "(s3fs, gcsfuse, NFS, a ReadWriteMany volume) on every node and give the mount's path"
        )
    return value


class FeedbackSettings(BaseModel):
    """The feedback loop: the joiner (predictions ⋈ labels; its topics' defaults are its own,
    ``feedback_loop/joiner_settings.py``), snapshots, training."""

    horizon_s: float = Field(
        default=7 * 86_400,
        gt=0,
        description="How long a prediction waits for its label; then unlabeled (default: the project's labels.horizon).",
    )
    group_id: str = "loopline-feedback"
    out_of_orderness_ms: int = Field(default=5_000, ge=0, description="How far out of order records' Kafka timestamps may be.")
    checkpoint_interval_ms: int = Field(default=5_000, ge=100)
    checkpoint_dir: str | None = Field(
        default=None,
        description="The joiner's checkpoints and savepoints: a path or any Flink "
        "filesystem URI; default <home>/checkpoints/<group_id>.",
    )
    parallelism: int = Field(default=JoinerSettings.parallelism, ge=1)
    metrics_port: int | None = Field(default=9250, ge=0, le=65535, description="The joiner's Prometheus metrics; 0 or null: off.")
    snapshots: str | None = Field(default=None, description="Where snapshots go: a path or fsspec URL; default <home>/snapshots.")
    train_config: Path | None = Field(
        default=None,
        description="Model and hyper-parameters; default: the project's "
        "model.train_config, else offline_training/configs/mlp.yaml.",
    )
    train_processes: int | None = Field(
        default=None,
        ge=1,
        description="Training processes per node (torchrun "
        "--nproc_per_node); default one per visible GPU (CUDA_VISIBLE_DEVICES, else "
        "nvidia-smi -L), else 2 on a CPU.",
    )
    train_niceness: int = Field(
        default=0,
        ge=0,
        le=19,
        description="The training processes' CPU niceness (nice -n): raise it "
        "where training shares a machine with serving, so serving gets the cores first.",
    )
    train_dir: Annotated[Path | None, BeforeValidator(_mounted_path)] = Field(
        default=None,
        description="Training runs' checkpoints, model files and metrics (<train_dir>/<snapshot id>); on several "
        "nodes, a folder every node mounts at this path (NFS, a ReadWriteMany volume). Default <home>/training.",
    )
    train_max_restarts: int = Field(
        default=0,
        ge=0,
        description="How often torchrun restarts every node's workers after one "
        "fails or a node rejoins (they resume from the newest checkpoint); 0: a failure ends the run.",
    )
    predictions_topic: str = Field(default=JoinerSettings.predictions_topic, description="The predictions the joiner joins.")
    labels_topic: str = Field(
        default="events.labels", description="... with the labels of this topic (default: the project's labels.topic)."
    )
    examples_topic: str = Field(
        default=JoinerSettings.examples_topic,
        description="The labeled examples: the joiner writes them, snapshots, releases and the retrain trigger read them.",
    )
    dead_letter_topic: str = Field(default=JoinerSettings.dead_letter_topic, description="The joiner's dead letters.")


class ReleaseSettings(BaseModel):
    """The release controller: where it reads the scorers' metrics, how often, and its policy
    (``offline_training/release_policy.py``)."""

    metrics_urls: list[str] = Field(default_factory=list, description="Scorers' /metrics; default the local scorer's.")
    poll_s: float = Field(default=10.0, gt=0)
    min_watch_s: float = Field(
        default=ReleasePolicy.min_watch_s, ge=0, description="Watch a canary at least this long before promoting."
    )
    max_watch_s: float = Field(default=ReleasePolicy.max_watch_s, gt=0, description="Without enough evidence by then: roll back.")
    min_requests: int = Field(default=ReleasePolicy.min_requests, ge=0)
    max_error_rate_increase: float = Field(default=ReleasePolicy.max_error_rate_increase, ge=0)
    max_latency_ratio: float = Field(default=ReleasePolicy.max_latency_ratio, ge=1)
    min_labels: int = Field(default=ReleasePolicy.min_labels, ge=1, description="Labeled events per arm before quality counts.")
    max_auc_drop: float = Field(
        default=ReleasePolicy.max_auc_drop,
        ge=0,
        description="A binary label: roll back a canary whose AUC falls this far below prod's.",
    )
    max_rmse_increase: float = Field(
        default=ReleasePolicy.max_rmse_increase,
        ge=0,
        description="A numeric label: roll back a canary whose RMSE exceeds prod's by this share.",
    )
    require_quality: bool = Field(
        default=ReleasePolicy.require_quality, description="Promote only with enough labels on both arms."
    )

    def policy(self, label_kind: Literal["binary", "numeric"]) -> ReleasePolicy:
        """The policy these settings declare, for a label of ``label_kind``."""
        values = {name: getattr(self, name) for name in ReleasePolicy.__dataclass_fields__ if name != "label_kind"}
        return ReleasePolicy(**values, label_kind=label_kind)


def os_user() -> str:
    """The OS user this process runs as, or "unknown" for a user without a name (a container's uid without a passwd entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


#: The monitor's paging alerts that fire the retrain trigger by default: distribution skew (PSI, JS, L∞) and
#: online/offline inconsistency (warnings do not).
RETRAIN_ALERTS = (
    "LooplineFeatureSkew",
    "LooplineFeatureDistributionShift",
    "LooplineCategoryShift",
    "LooplineFeatureInconsistent",
)


class RetrainSettings(BaseModel):
    """Retraining: how a trained candidate is judged against prod and released (`loopline train`), and the trigger that
    retrains when prod's labeled quality falls or a skew or consistency alert fires for it (`loopline retrain watch`,
    ``feedback_loop/retrain_trigger.py``)."""

    threshold: float = Field(default=0.5, gt=0, lt=1, description="The operating threshold precision and recall are measured at.")
    max_auc_drop: float = Field(
        default=0.01, ge=0, description="A binary label: register only if the holdout AUC is at most this below prod's."
    )
    max_rmse_increase: float = Field(
        default=0.05, ge=0, description="A numeric label: register only if the holdout RMSE is at most this share above prod's."
    )
    quantize: bool = Field(
        default=False, description="Also try dynamic INT8 (ONNX Runtime, CPU); registered when its quality holds."
    )
    max_quantized_change: float = Field(
        default=0.005,
        ge=0,
        description="INT8 is kept only within this of fp32's holdout AUC "
        "(points, a binary label) or RMSE (a share, a numeric label).",
    )
    mode: Literal["off", "notify", "retrain"] = Field(default="notify", description="What the trigger does when quality falls.")
    alert_mode: Literal["off", "notify", "retrain"] = Field(
        default="notify", description="What it does when one of `alerts` fires."
    )
    alerts: list[str] = Field(
        default_factory=lambda: list(RETRAIN_ALERTS),
        description="Prometheus alerts (infra/prometheus/) that fire the trigger for the version they name.",
    )
    window_s: float = Field(
        default=TriggerPolicy.window_s, gt=0, description="Judge prod on the examples it scored this far back."
    )
    min_auc: float = Field(
        default=TriggerPolicy.min_auc, gt=0, lt=1, description="A binary label: below this labeled AUC, the trigger fires."
    )
    max_rmse: float | None = Field(
        default=TriggerPolicy.max_rmse,
        gt=0,
        description="A numeric label: above this labeled RMSE (in the label's units), the trigger fires; unset: not judged.",
    )
    max_calibration_error: float | None = Field(
        default=TriggerPolicy.max_calibration_error, gt=0, description="Above this, it fires too; unset: not judged."
    )
    min_labels: int = Field(
        default=TriggerPolicy.min_labels, ge=1, description="Labeled examples of prod in the window before quality is judged."
    )
    cooldown_s: float = Field(
        default=TriggerPolicy.cooldown_s, ge=0, description="Quiet this long after firing (the retraining it started)."
    )
    poll_s: float = Field(default=300.0, gt=0, description="How often `retrain watch` looks.")
    canary_percent: float = Field(default=5.0, ge=0, le=100, description="% of requests the trigger's version takes; 0: none.")
    owner: str = Field(
        default_factory=os_user,
        min_length=1,
        description="Who answers for the models trained here (their cards' owner); default: the OS user training.",
    )
    launcher: Literal["local", "trainjob"] = Field(
        default="local",
        description=(
            "How the trigger's retrain trains: local, in its own process (torchrun); trainjob, a Kubeflow TrainJob it creates "
            "through the Kubernetes API as its pod's service account (the chart's retrain trigger)."
        ),
    )
    trainjob_template: Path | None = Field(
        default=None,
        description=(
            "The TrainJob a retrain starts from (the chart's retrain-trainjob ConfigMap, mounted); needed by launcher trainjob."
        ),
    )

    @model_validator(mode="after")
    def _launcher_has_its_template(self) -> RetrainSettings:
        if self.launcher == "trainjob" and self.trainjob_template is None:
            raise ValueError(
                "retrain.launcher trainjob needs retrain.trainjob_template: the TrainJob the chart renders "
                "for the trigger (its ConfigMap, mounted in the trigger's pod)"
            )
        return self

    def trigger_policy(self) -> TriggerPolicy:
        """The trigger's policy these settings declare (for a binary label; its kind is the project's)."""
        return TriggerPolicy(**{name: getattr(self, name) for name in TriggerPolicy.__dataclass_fields__ if name != "label_kind"})

    def mode_for(self, causes: Collection[Literal["quality", "alert"]]) -> Literal["off", "notify", "retrain"]:
        """What the trigger does about a firing with ``causes``: the strongest of their modes (``mode`` for quality,
        ``alert_mode`` for an alert), so a bad quality and a skew alert together retrain if either one's mode says so."""
        modes = {self.mode if cause == "quality" else self.alert_mode for cause in causes}
        return next((mode for mode in ("retrain", "notify") if mode in modes), "off")


class SkewThresholdSettings(BaseModel):
    """When a feature's distribution skew warns or alerts (the field's usual defaults; a per-feature entry's unset
    ones are these defaults too, not ``monitor.thresholds``)."""

    psi_warn: float = Field(default=SkewThresholds.psi_warn, gt=0)
    psi_alert: float = Field(default=SkewThresholds.psi_alert, gt=0)
    js_alert: float = Field(default=SkewThresholds.js_alert, gt=0, le=1)
    linf_alert: float = Field(default=SkewThresholds.linf_alert, gt=0, le=1)

    @model_validator(mode="after")
    def _warns_before_it_alerts(self) -> SkewThresholdSettings:
        if self.psi_warn > self.psi_alert:
            raise ValueError(
                f"psi_warn {self.psi_warn} is above psi_alert {self.psi_alert}: a feature would page before it warns"
            )
        return self

    def thresholds(self) -> SkewThresholds:
        """The thresholds these settings declare."""
        return SkewThresholds(**self.model_dump())


class MonitorSettings(BaseModel):
    """The skew and consistency monitor (`loopline monitor`, ``feedback_loop/monitor.py``)."""

    app_id: str = Field(default="loopline-monitor", description="The faust app id: its consumer group and changelog topics.")
    metrics_port: int = Field(default=9260, ge=1, le=65535)
    window_s: float = Field(default=900.0, gt=0, description="Skew is measured over the predictions scored this far back.")
    bucket_s: float = Field(default=60.0, gt=0, description="The window moves in steps of this.")
    check_interval_s: float = Field(default=10.0, gt=0)
    min_rows: int = Field(
        default=300, ge=1, description="A model version's skew is published once its window holds this many rows."
    )
    reference_snapshot: str | None = Field(
        default=None, description="Measure against this snapshot; default: the training snapshot of the version prod names."
    )
    thresholds: SkewThresholdSettings = SkewThresholdSettings()
    feature_thresholds: dict[str, SkewThresholdSettings] = Field(default_factory=dict, description="Per feature (view:feature).")
    sample_rate: float = Field(
        default=0.1, gt=0, le=1, description="Share of entity keys whose requests the consistency check replays."
    )
    consistency_interval_s: float = Field(default=60.0, gt=0)
    settle_s: float = Field(
        default=20.0, ge=0, description="Replay a request only this long after it was scored (late events arrive)."
    )
    max_sampled: int = Field(default=20_000, ge=1, description="Sampled requests held for the next replay; the oldest go first.")
    from_earliest: bool = Field(default=False, description="A new monitor reads scoring.predictions from its start, not its end.")


class ModelRegistrySettings(BaseModel):
    """The MLflow model registry: training registers and releases versions there, serving loads them."""

    tracking_uri: str | None = Field(default=None, description="Default: sqlite:///<home>/mlflow/mlflow.db; a server at scale.")
    artifact_location: str | None = Field(
        default=None, description="Where new versions' files go; default <home>/mlflow/artifacts."
    )


class Settings(BaseSettings):
    """Everything Loopline can be configured with."""

    model_config = SettingsConfigDict(env_prefix="LOOPLINE_", env_nested_delimiter="__", extra="forbid")

    project: Path | None = Field(
        default=None,
        description="The Loopline project (a folder with loopline_project.yaml; "
        "`loopline --project`); default: the working directory's, or the nearest folder above it.",
    )
    home: Path = Field(default=Path(".loopline"), description="Root of the local stack's state.")
    data_dir: Path | None = Field(default=None, description="Service data; default <home>/data.")
    logs_dir: Path | None = Field(default=None, description="Service logs; default <home>/logs.")
    jars_dir: Path | None = Field(default=None, description="Cached Maven jars; default <home>/jars.")
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    jaeger: JaegerSettings = JaegerSettings()
    producer: ProducerSettings = ProducerSettings()
    feature_store: FeatureStoreSettings = FeatureStoreSettings()
    stream: StreamSettings = StreamSettings()
    flink: FlinkSettings = FlinkSettings()
    serving: ServingSettings = ServingSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    release: ReleaseSettings = ReleaseSettings()
    model_registry: ModelRegistrySettings = ModelRegistrySettings()
    retrain: RetrainSettings = RetrainSettings()
    monitor: MonitorSettings = MonitorSettings()
    dashboard: DashboardSettings = DashboardSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        for name in os.environ:
            _check_environment_name(settings_cls, name)
        config_file = Path(os.environ.get("LOOPLINE_CONFIG", DEFAULT_CONFIG_FILE))
        if "LOOPLINE_CONFIG" in os.environ and not config_file.is_file():
            raise FileNotFoundError(f"LOOPLINE_CONFIG names {config_file}, which does not exist")
        yaml_source = YamlConfigSettingsSource(settings_cls, yaml_file=config_file)
        explicit = (init_settings, env_settings, yaml_source)
        return *explicit, _ProjectSource(settings_cls, explicit), _StackShapeSource(settings_cls, explicit)

    @property
    def resolved_data_dir(self) -> Path:
        """Where services keep their data."""
        return (self.data_dir or self.home / "data").absolute()

    @property
    def resolved_logs_dir(self) -> Path:
        """Where services write their logs."""
        return (self.logs_dir or self.home / "logs").absolute()

    @property
    def resolved_jars_dir(self) -> Path:
        """Where the Maven jars are cached."""
        return (self.jars_dir or self.home / "jars").absolute()

    @property
    def project_path(self) -> Path:
        """The project in force: ``project``, else the one holding the working directory (ProjectError when none)."""
        from loopline.project import project_path

        return project_path(self.project)

    @property
    def repo_path(self) -> Path:
        """The project's Feast repository (definitions and feature_store.yaml)."""
        from loopline.project import loaded_project

        return loaded_project(self.project_path).feature_repo

    @property
    def feast_registry_path(self) -> Path:
        """The Feast registry file: by default the one the repo's feature_store.yaml names, so `feast` in the
        repo folder and Loopline act on one Feast registry."""
        from feature_store.config import declared_feast_registry

        return (self.feature_store.feast_registry_path or declared_feast_registry(self.repo_path)).absolute()

    @property
    def auth_token(self) -> str | None:
        """The scorer's bearer token, from the setting or its file (None: no authentication)."""
        serving = self.serving
        if serving.auth_token_file is not None:
            return serving.auth_token_file.read_text().strip()
        return serving.auth_token.get_secret_value() if serving.auth_token is not None else None

    @property
    def checkpoints_root(self) -> Path:
        """Where the jobs' checkpoints go unless their settings name a location: one folder per consumer group."""
        return (self.home / "checkpoints").absolute()

    @property
    def checkpoint_dir(self) -> str:
        """Where the streaming job keeps its checkpoints and savepoints (a path or Flink filesystem URI): by default
        one folder per consumer group, so a job never resumes from another job's offsets and state."""
        return self.stream.checkpoint_dir or str(self.checkpoints_root / self.stream.group_id)

    @property
    def feedback_checkpoint_dir(self) -> str:
        """Where the feedback joiner keeps its checkpoints and savepoints (by default one folder per consumer group)."""
        return self.feedback.checkpoint_dir or str(self.checkpoints_root / self.feedback.group_id)

    @property
    def snapshots_root(self) -> str:
        """Where training snapshots live (a path or fsspec URL)."""
        return self.feedback.snapshots or str((self.home / "snapshots").absolute())

    @property
    def training_root(self) -> Path:
        """Where training runs keep their folders (one per snapshot): checkpoints, model files, metrics, model card."""
        return (self.feedback.train_dir or self.home / "training").absolute()

    @property
    def tracking_uri(self) -> str:
        """The model registry's MLflow tracking URI."""
        return self.model_registry.tracking_uri or f"sqlite:///{(self.home / 'mlflow' / 'mlflow.db').absolute()}"

    @property
    def artifact_location(self) -> str:
        """Where newly registered model versions keep their files."""
        return self.model_registry.artifact_location or str((self.home / "mlflow" / "artifacts").absolute())

    @property
    def redis_connection(self) -> str:
        """The online store as a Feast Redis connection string (host:port of every node, then password and TLS when
        set): a cluster client starts from any node that answers."""
        options = []
        if self.redis.password is not None:
            options.append(f"password={self.redis.password.get_secret_value()}")
        if self.redis.ssl:
            options.append("ssl=true")
        return ",".join([*self.redis.addresses, *options])

    @property
    def redis_cluster(self) -> bool:
        """Whether the online store is a Redis Cluster (every Redis client of Loopline and Feast's then is one)."""
        return self.redis.mode == "cluster"

    @property
    def run_dir(self) -> Path:
        """Pid files of the services the stack started."""
        return (self.home / "run").absolute()


class _DerivedSource(PydanticBaseSettingsSource):
    """Settings derived from what the explicit sources (arguments, environment, settings file) say, beneath them."""

    def __init__(self, settings_cls: type[BaseSettings], explicit: tuple[PydanticBaseSettingsSource, ...]) -> None:
        super().__init__(settings_cls)
        self.explicit = explicit

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def explicit_value(self, name: str) -> Any:
        """The top-level setting ``name`` as the first explicit source giving it says (None if none does)."""
        return next((source().get(name) for source in self.explicit if source().get(name)), None)


class _ProjectSource(_DerivedSource):
    """The project's serving budget, model, labels, training config and skew thresholds as settings, beneath every
    explicit source: what the domain declares is the default an operator may still override."""

    def __call__(self) -> dict[str, Any]:
        from loopline.project import loaded_project
        from schemas.project import duration_ms, find_project

        named = self.explicit_value("project")
        path = Path(named) if named else find_project(Path.cwd())
        if path is None or not (path / "loopline_project.yaml").is_file():
            return {}
        project = loaded_project(path.absolute())
        spec = project.spec
        feedback: dict[str, Any] = {"labels_topic": spec.labels.topic, "horizon_s": duration_ms(spec.labels.horizon) / 1000}
        if spec.model.train_config:
            feedback["train_config"] = project.resolve(spec.model.train_config)
        thresholds = {name: dict(limits) for name, limits in spec.monitoring.skew_thresholds.items()}
        return {
            "serving": {"model_name": spec.model.name, "feature_budget_ms": spec.serving.feature_budget_ms},
            "feedback": feedback,
            "monitor": {"feature_thresholds": thresholds},
        }


class _StackShapeSource(_DerivedSource):
    """The remembered stack shape (``STACK_SHAPE_FILE`` under the home the explicit sources name), as settings."""

    def __call__(self) -> dict[str, Any]:
        return read_stack_shape(Path(self.explicit_value("home") or settings_default("home")))


def settings_default(name: str) -> Any:
    """The default of the top-level setting ``name``."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


def read_stack_shape(home: Path) -> dict[str, Any]:
    """The stack shape remembered under ``home`` (empty when none is)."""
    path = home / STACK_SHAPE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def forget_stack_shape(home: Path) -> None:
    """Forget the remembered stack shape (the stack's data went with it)."""
    (home / STACK_SHAPE_FILE).unlink(missing_ok=True)


def remember_stack_shape(home: Path, shape: dict[str, dict[str, Any]]) -> None:
    """Remember ``shape`` (by section: ``{"kafka": {"brokers": 3}}``) as the stack's, merged into what was."""
    merged = read_stack_shape(home)
    for section, values in shape.items():
        merged[section] = {**merged.get(section, {}), **values}
    home.mkdir(parents=True, exist_ok=True)
    (home / STACK_SHAPE_FILE).write_text(json.dumps(merged, indent=2) + "\n")


class UnknownSettingError(ValueError):
    """A ``LOOPLINE_*`` variable names no setting (a typo, or a setting renamed): it would be passed over silently."""


def _environment_names(model: type[BaseModel], prefix: str = "LOOPLINE_") -> dict[str, type[BaseModel] | None]:
    """Every variable name the settings take, with the model a name's nested parts continue into (None: a value)."""
    names: dict[str, type[BaseModel] | None] = {}
    for field, info in model.model_fields.items():
        inner = next(
            (t for t in (info.annotation, *typing.get_args(info.annotation)) if isinstance(t, type) and issubclass(t, BaseModel)),
            None,
        )
        names[f"{prefix}{field.upper()}"] = inner
        if inner is not None:
            names |= _environment_names(inner, f"{prefix}{field.upper()}__")
    return names


def _check_environment_name(model: type[BaseModel], name: str) -> None:
    """UnknownSettingError, with the closest names, when ``name`` is a ``LOOPLINE_*`` variable that no setting takes."""
    if not name.startswith("LOOPLINE_") or name == "LOOPLINE_CONFIG":
        return
    names = _environment_names(model)
    parts = name.split("__")
    # A dict setting (kafka.client_config) takes any key under it; a model's field only its own.
    known = next(
        (("__".join(parts[:i]), names["__".join(parts[:i])]) for i in range(len(parts), 0, -1) if "__".join(parts[:i]) in names),
        None,
    )
    if known is not None and (known[0] == name or known[1] is None and _is_mapping(model, known[0])):
        return
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    raise UnknownSettingError(
        f"{name} names no setting"
        + (f" (did you mean {' or '.join(close)}?)" if close else "")
        + "; `loopline config` lists the settings"
    )


def _is_mapping(model: type[BaseModel], name: str) -> bool:
    """Whether the setting ``name`` (a variable name) holds a mapping, whose keys are the user's."""
    *path, last = name.removeprefix("LOOPLINE_").lower().split("__")
    for part in path:
        model = next(
            t
            for t in (model.model_fields[part].annotation, *typing.get_args(model.model_fields[part].annotation))
            if isinstance(t, type) and issubclass(t, BaseModel)
        )
    annotation = model.model_fields[last].annotation
    return typing.get_origin(annotation) is dict or annotation is dict


def settings_environment(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment, with ``LOOPLINE_*`` variables that make a `loopline` child process use
    ``settings`` (plus ``extra``); the parent's own ``LOOPLINE_*`` variables are replaced."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOOPLINE_")}
    values = settings.model_dump(exclude_defaults=True)
    for name, value in values.items():
        if isinstance(value, dict) and isinstance(getattr(settings, name), BaseModel):
            env |= {f"LOOPLINE_{name.upper()}__{field.upper()}": _env_value(v) for field, v in value.items()}
        else:
            env[f"LOOPLINE_{name.upper()}"] = _env_value(value)
    env["LOOPLINE_HOME"] = str(settings.home.absolute())
    return env | extra


def _env_value(value: Any) -> str:
    """A setting as an environment variable's text (JSON for anything but text, numbers and paths)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, (str, int, float, Path)) and not isinstance(value, bool):
        return str(value.absolute() if isinstance(value, Path) else value)
    return json.dumps(value, default=lambda v: v.get_secret_value() if isinstance(v, SecretStr) else str(v))
