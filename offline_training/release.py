"""Releasing models through the MLflow model registry (conventions in ``schemas/model_registry.py``).

Registering a version logs its ONNX file as a run artifact, creates the model version from it and
records the file's SHA-256 on the version, so serving can check that what it loads is what was
registered. Releasing is then moving aliases: ``prod``, and ``canary`` with its traffic share.
Every move is recorded with who or what made it and why (``AliasChange``), so ``history`` can tell
what served when, and ``rollback`` can point ``prod`` back at the version it replaced.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from offline_training.errors import OfflineTrainingError
from schemas.model_registry import (
    ARTIFACT_DIR,
    ARTIFACT_FILE,
    CANARY_ALIAS,
    CANARY_SHARE_TAG,
    EXPERIMENT,
    PROD_ALIAS,
    SHA256_TAG,
    AliasChange,
    artifact_sha256,
    parse_canary_share,
)

if TYPE_CHECKING:
    from mlflow.entities.model_registry import RegisteredModel


class ReleaseError(OfflineTrainingError, ValueError):
    """The registry refused a release step (e.g. a version that does not exist)."""


class ModelRelease:
    """Registers model versions and moves their aliases in the registry at ``tracking_uri``.

    ``artifact_location`` is where new runs keep their artifacts (a local folder by default; any
    store MLflow knows at scale). The tracking URI is both MLflow's tracking and registry store.
    """

    def __init__(self, tracking_uri: str, artifact_location: str) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        self.experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT, artifact_location)
        )

    def register(self, name: str, model_path: Path, description: str = "") -> str:
        """Register the ONNX file at ``model_path`` as a new version of ``name``; its version number."""
        from mlflow.exceptions import MlflowException

        sha256 = artifact_sha256(model_path)
        run = self.client.create_run(self.experiment_id, tags={"mlflow.runName": f"register {name}"})
        with tempfile.TemporaryDirectory() as staging:
            artifact = Path(staging) / ARTIFACT_FILE
            artifact.write_bytes(model_path.read_bytes())
            self.client.log_artifact(run.info.run_id, str(artifact), artifact_path=ARTIFACT_DIR)
        self.client.set_terminated(run.info.run_id)
        try:
            self.client.create_registered_model(name)
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        version = self.client.create_model_version(
            name,
            source=f"{run.info.artifact_uri}/{ARTIFACT_DIR}",
            run_id=run.info.run_id,
            tags={SHA256_TAG: sha256},
            description=description,
        )
        return str(version.version)

    def _registered(self, name: str) -> RegisteredModel:
        """The registered model ``name``; ReleaseError when there is none (a typo, or another registry)."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException as err:
            raise ReleaseError(f"no registered model {name!r} in this model registry: {err.message}") from err

    def history(self, name: str) -> list[AliasChange]:
        """Every recorded alias change of ``name``, oldest first."""
        return AliasChange.from_tags(self._registered(name).tags)

    def aliases(self, name: str) -> dict[str, str]:
        """The version each alias of ``name`` names now."""
        return {alias: str(version) for alias, version in self._registered(name).aliases.items()}

    def _record(self, name: str, alias: str, previous: str | None, version: str | None, actor: str, reason: str) -> None:
        change = AliasChange(int(time.time() * 1000), actor, alias, previous, version, reason)
        self.client.set_registered_model_tag(name, *change.tag(len(self.history(name)) + 1))

    def set_alias(self, name: str, alias: str, version: str, actor: str = "unknown", reason: str = "") -> None:
        """Point ``alias`` of ``name`` at ``version`` (serving picks it up at its next poll) and record it; ReleaseError
        when there is no such version."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_model_version(name, version)
        except MlflowException as err:
            raise ReleaseError(f"{name} has no version {version!r}: {err.message}") from err
        previous = self.aliases(name).get(alias)
        self.client.set_registered_model_alias(name, alias, version)
        self._record(name, alias, previous, version, actor, reason)

    def start_canary(self, name: str, version: str, share: float, actor: str = "unknown", reason: str = "") -> None:
        """Send ``share`` of ``name``'s traffic to ``version`` (alias ``canary``)."""
        share = parse_canary_share(str(share))
        self.set_alias(name, CANARY_ALIAS, version, actor, reason or f"canary on {share:.0%} of requests")
        self.client.set_registered_model_tag(name, CANARY_SHARE_TAG, str(share))

    def end_canary(self, name: str, actor: str = "unknown", reason: str = "") -> None:
        """Send all traffic back to ``prod``."""
        previous = self.aliases(name).get(CANARY_ALIAS)
        self.client.set_registered_model_tag(name, CANARY_SHARE_TAG, "0")
        if previous is not None:
            self.client.delete_registered_model_alias(name, CANARY_ALIAS)
            self._record(name, CANARY_ALIAS, previous, None, actor, reason or "canary ended")

    def promote(self, name: str, version: str, actor: str = "unknown", reason: str = "") -> None:
        """Point ``prod`` at ``version`` and end any canary."""
        self.set_alias(name, PROD_ALIAS, version, actor, reason or "promoted")
        self.end_canary(name, actor, f"v{version} promoted")

    def rollback(self, name: str, actor: str = "unknown", reason: str = "") -> str:
        """Point ``prod`` back at the version its last move replaced (and end any canary); that version.
        ReleaseError when prod has no earlier version on record."""
        moves = [c for c in self.history(name) if c.alias == PROD_ALIAS and c.previous is not None]
        if not moves:
            raise ReleaseError(f"{name}: prod has never replaced a version, so there is nothing to roll back to")
        previous = moves[-1].previous
        self.set_alias(name, PROD_ALIAS, previous, actor, reason or f"rolled back from v{moves[-1].version}")
        self.end_canary(name, actor, "rollback")
        return previous
