"""Releasing models: the release controller's settings (``release``) and the model registry's (``model_registry``);
``loopline/settings.py`` composes and reads them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from offline_training.release_policy import ReleasePolicy


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


class ModelRegistrySettings(BaseModel):
    """The MLflow model registry: training registers and releases versions there, serving loads them."""

    tracking_uri: str | None = Field(default=None, description="Default: sqlite:///<home>/mlflow/mlflow.db; a server at scale.")
    artifact_location: str | None = Field(
        default=None, description="Where new versions' files go; default <home>/mlflow/artifacts."
    )
