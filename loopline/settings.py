"""Loopline's one typed settings object, composed of each component's settings model (each beside its component:
``schemas/kafka_settings.py``, ``feature_store/settings.py``, ``streams/settings.py``, ``online/settings.py``,
``feedback_loop/settings.py``, ``offline_training/settings.py``, ``infra/settings.py``).

Sources, highest priority first: constructor arguments, ``LOOPLINE_*`` environment variables
(nested with ``__``, e.g. ``LOOPLINE_KAFKA__PORT=19092``), the YAML file named by
``LOOPLINE_CONFIG`` (or ``loopline.yaml`` in the working directory when present), the project's
declarations (``_ProjectSource``), the remembered stack shape (``_StackShapeSource``), defaults.
Nested sections merge key by key: a higher source overrides the values it names and keeps the rest.
Only this package reads settings; components receive plain values.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from feature_store.settings import FeatureStoreSettings, RedisSettings
from feedback_loop.settings import FeedbackSettings, MonitorSettings, RetrainSettings
from infra.settings import DashboardSettings, FlinkSettings, JaegerSettings, PrometheusSettings
from offline_training.settings import ModelRegistrySettings, ReleaseSettings
from online.settings import ServingSettings
from schemas.kafka_settings import KafkaSettings
from streams.settings import ProducerSettings, StreamSettings

DEFAULT_CONFIG_FILE = Path("loopline.yaml")
#: Under the home: the shape `loopline stack up` gave the stack (``{"kafka": {"brokers": 3}}``), adopted by later
#: commands' settings beneath every explicit source, so `stack status`, `stack down` and every client see that stack.
STACK_SHAPE_FILE = "stack-shape.json"


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
