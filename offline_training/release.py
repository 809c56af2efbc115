"""Releasing models through the MLflow model registry (conventions in ``schemas/model_registry.py``).

Registering a version logs its ONNX file as a run artifact, creates the model version from it and
records the file's SHA-256 on the version, so serving can check that what it loads is what was
registered. Releasing is then moving aliases: ``prod``, and ``canary`` with its traffic share.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from schemas.model_registry import (
    ARTIFACT_DIR,
    ARTIFACT_FILE,
    CANARY_ALIAS,
    CANARY_SHARE_TAG,
    EXPERIMENT,
    SHA256_TAG,
    artifact_sha256,
    parse_canary_share,
)


class ReleaseError(ValueError):
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
            name, source=f"{run.info.artifact_uri}/{ARTIFACT_DIR}", run_id=run.info.run_id,
            tags={SHA256_TAG: sha256}, description=description,
        )  # fmt: skip
        return str(version.version)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        """Point ``alias`` of ``name`` at ``version`` (serving picks it up at its next poll); ReleaseError
        when there is no such version."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_model_version(name, version)
        except MlflowException as err:
            raise ReleaseError(f"{name} has no version {version!r}: {err.message}") from err
        self.client.set_registered_model_alias(name, alias, version)

    def start_canary(self, name: str, version: str, share: float) -> None:
        """Send ``share`` of ``name``'s traffic to ``version`` (alias ``canary``)."""
        share = parse_canary_share(str(share))
        self.set_alias(name, CANARY_ALIAS, version)
        self.client.set_registered_model_tag(name, CANARY_SHARE_TAG, str(share))

    def end_canary(self, name: str) -> None:
        """Send all traffic back to ``prod``."""
        self.client.set_registered_model_tag(name, CANARY_SHARE_TAG, "0")
        if CANARY_ALIAS in self.client.get_registered_model(name).aliases:
            self.client.delete_registered_model_alias(name, CANARY_ALIAS)
