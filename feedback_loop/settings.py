"""The feedback loop's settings models: the joiner, snapshots and training (``feedback``), the retrain trigger
(``retrain``) and the skew monitor (``monitor``); ``loopline/settings.py`` composes and reads them."""

from __future__ import annotations

import getpass
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from feedback_loop.drift import SkewThresholds
from feedback_loop.joiner_settings import JoinerSettings
from feedback_loop.retrain_trigger import TriggerPolicy


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
        description="Who answers for the models trained here (their cards' owner); default: the login name of whoever trains.",
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
