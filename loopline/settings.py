"""Loopline's one typed settings object.

Sources, highest priority first: constructor arguments, ``LOOPLINE_*`` environment variables
(nested with ``__``, e.g. ``LOOPLINE_KAFKA__PORT=19092``), the YAML file named by
``LOOPLINE_CONFIG`` (or ``loopline.yaml`` in the working directory when present), defaults.
Only this package reads settings; components receive plain values.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

DEFAULT_CONFIG_FILE = Path("loopline.yaml")


class KafkaSettings(BaseModel):
    """The local Kafka broker (KRaft, combined broker + controller)."""

    host: str = "127.0.0.1"
    port: int = Field(default=9092, ge=1, le=65535)
    controller_port: int = Field(default=9093, ge=1, le=65535)
    heap_mb: int = Field(default=512, ge=128)
    start_timeout_s: float = Field(default=60.0, gt=0)

    @property
    def bootstrap_servers(self) -> str:
        """The address clients connect to."""
        return f"{self.host}:{self.port}"


class RedisSettings(BaseModel):
    """The local Redis server (the Feast online store)."""

    host: str = "127.0.0.1"
    port: int = Field(default=6379, ge=1, le=65535)
    start_timeout_s: float = Field(default=20.0, gt=0)


class ProducerSettings(BaseModel):
    """Defaults of the synthetic transaction producer."""

    users: int = Field(default=5_000, ge=1)
    merchants: int = Field(default=500, ge=1)
    out_of_order_rate: float = Field(default=0.05, ge=0, le=1)
    max_out_of_order_s: float = Field(default=5.0, ge=0)
    late_rate: float = Field(default=0.005, ge=0, le=1)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)


class FeatureStoreSettings(BaseModel):
    """Where Feast keeps its registry (the repo itself is ``feature_store/repo``)."""

    registry_path: Path | None = Field(default=None, description="Default <home>/feast/registry.db.")


class StreamSettings(BaseModel):
    """The streaming feature job."""

    group_id: str = "loopline-features"
    source_topic: str | None = Field(default=None, description="Read this topic instead of the Feast source's.")
    dead_letter_topic: str = "events.dlq"
    checkpoint_interval_ms: int = Field(default=5_000, ge=100)
    flush_interval_ms: int = Field(
        default=50, ge=1, description="Longest a row waits for a Python batch (decode, online write): freshness."
    )
    max_batch_rows: int = Field(default=2_000, ge=1, description="Rows per Python batch (Arrow): throughput.")
    parallelism: int = Field(default=1, ge=1)
    offline_dir: Path | None = Field(
        default=None,
        description="Append feature rows under <dir>/<view>; default: the path each view's FileSource declares.",
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


class ServingSettings(BaseModel):
    """The online scorer (`loopline serve`)."""

    host: str = Field(default="127.0.0.1", description="Where the HTTP and gRPC doors listen.")
    http_port: int = Field(default=8080, ge=1, le=65535)
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    model_name: str = Field(default="fraud", description="The registered model to serve (its prod and canary aliases).")
    model_path: Path | None = Field(default=None, description="Serve this ONNX file instead of the registry's versions.")
    model_version: str = Field(default="file", description="The version a model_path file is reported as.")
    registry_poll_s: float = Field(default=5.0, gt=0, description="How often the scorer checks the registry's aliases.")
    llm: LlmSettings | None = Field(default=None, description="Serve this LLM (vLLM) instead of ONNX models.")
    feature_budget_ms: float = Field(default=20.0, gt=0, description="Feature fetch budget; then defaults.")
    max_batch_size: int = Field(default=64, ge=1)
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    max_queue_size: int = Field(default=1024, ge=1)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    result_cache_ttl_s: float | None = Field(default=None, gt=0, description="Cache scores in Redis this long; off when unset.")
    log_predictions: bool = Field(default=True, description="HTTP/gRPC doors append records to scoring.predictions.")
    kafka_group_id: str = "loopline-scorer"
    instance: str = Field(default="0", description="This member's name: its Kafka transactional id is <group>-<instance>.")


class RegistrySettings(BaseModel):
    """The MLflow model registry: training registers and releases versions there, serving loads them."""

    tracking_uri: str | None = Field(default=None, description="Default: sqlite:///<home>/mlflow/mlflow.db; a server at scale.")
    artifact_location: str | None = Field(default=None, description="Where new versions' files go; default <home>/mlflow/artifacts.")


class Settings(BaseSettings):
    """Everything Loopline can be configured with."""

    model_config = SettingsConfigDict(env_prefix="LOOPLINE_", env_nested_delimiter="__", extra="forbid")

    home: Path = Field(default=Path(".loopline"), description="Root of the local stack's state.")
    data_dir: Path | None = Field(default=None, description="Service data; default <home>/data.")
    logs_dir: Path | None = Field(default=None, description="Service logs; default <home>/logs.")
    jars_dir: Path | None = Field(default=None, description="Cached Maven jars; default <home>/jars.")
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    producer: ProducerSettings = ProducerSettings()
    feature_store: FeatureStoreSettings = FeatureStoreSettings()
    stream: StreamSettings = StreamSettings()
    serving: ServingSettings = ServingSettings()
    registry: RegistrySettings = RegistrySettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = Path(os.environ.get("LOOPLINE_CONFIG", DEFAULT_CONFIG_FILE))
        if "LOOPLINE_CONFIG" in os.environ and not config_file.is_file():
            raise FileNotFoundError(f"LOOPLINE_CONFIG names {config_file}, which does not exist")
        yaml_source = YamlConfigSettingsSource(settings_cls, yaml_file=config_file)
        return init_settings, env_settings, yaml_source

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
    def registry_path(self) -> Path:
        """The Feast registry file."""
        return (self.feature_store.registry_path or self.home / "feast" / "registry.db").absolute()

    @property
    def checkpoint_dir(self) -> Path:
        """Where the streaming job keeps its checkpoints: one folder per consumer group, so a job never
        resumes from another job's offsets and state."""
        return (self.home / "checkpoints" / self.stream.group_id).absolute()

    @property
    def tracking_uri(self) -> str:
        """The model registry's MLflow tracking URI."""
        return self.registry.tracking_uri or f"sqlite:///{(self.home / 'mlflow' / 'mlflow.db').absolute()}"

    @property
    def artifact_location(self) -> str:
        """Where newly registered model versions keep their files."""
        return self.registry.artifact_location or str((self.home / "mlflow" / "artifacts").absolute())

    @property
    def redis_address(self) -> str:
        """host:port of the online store."""
        return f"{self.redis.host}:{self.redis.port}"

    @property
    def run_dir(self) -> Path:
        """Pid files of the services the stack started."""
        return (self.home / "run").absolute()
