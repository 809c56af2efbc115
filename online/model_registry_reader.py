"""Serving's view of the MLflow model registry: which versions the aliases name, and their verified files.

The conventions (aliases, canary share, the artifact's SHA-256 tag) are in
``schemas/model_registry.py``. A downloaded artifact whose SHA-256 differs from the one recorded
at registration (or a version without one) is refused with ``ArtifactRefused``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.model_registry import (
    ARTIFACT_FILE,
    CANARY_ALIAS,
    CANARY_SHARE_TAG,
    PROD_ALIAS,
    SHA256_TAG,
    artifact_sha256,
    parse_canary_share,
)


class ArtifactRefused(RuntimeError):
    """A model version that must not be served: ``kind`` is ``artifact`` (not the file registered) or
    ``invalid_model`` (not a model the runtime can load)."""

    def __init__(self, name: str, version: str, reason: str, kind: str = "artifact") -> None:
        super().__init__(f"model {name} v{version} refused: {reason}")
        self.version, self.kind = version, kind


@dataclass(frozen=True)
class Assignment:
    """The versions the aliases name now, and the canary's share of the traffic."""

    prod: str | None
    canary: str | None
    canary_share: float

    def version(self, alias: str) -> str | None:
        """The version ``alias`` names, if any."""
        return {PROD_ALIAS: self.prod, CANARY_ALIAS: self.canary}[alias]


class ModelRegistryReader:
    """Reads one registered model (``name``) from the registry at ``tracking_uri``."""

    def __init__(self, tracking_uri: str, name: str) -> None:
        from mlflow import MlflowClient

        self.name = name
        self._client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def assignment(self) -> Assignment:
        """One read of the registered model's aliases and canary share."""
        model = self._client.get_registered_model(self.name)
        aliases = {alias: str(version) for alias, version in model.aliases.items()}  # MLflow gives ints
        return Assignment(
            prod=aliases.get(PROD_ALIAS),
            canary=aliases.get(CANARY_ALIAS),
            canary_share=parse_canary_share(model.tags.get(CANARY_SHARE_TAG)),
        )

    def fetch(self, version: str, destination: Path) -> Path:
        """Download ``version``'s model file under ``destination`` and verify it; its path."""
        from mlflow.artifacts import download_artifacts

        registered = self._client.get_model_version(self.name, version)
        expected = registered.tags.get(SHA256_TAG)
        if not expected:
            raise ArtifactRefused(self.name, version, f"no {SHA256_TAG} tag recorded at registration")
        folder = Path(download_artifacts(artifact_uri=registered.source, dst_path=str(destination)))
        path = folder / ARTIFACT_FILE
        if not path.is_file():
            raise ArtifactRefused(self.name, version, f"its artifact holds no {ARTIFACT_FILE}")
        actual = artifact_sha256(path)
        if actual != expected:
            raise ArtifactRefused(self.name, version, f"artifact sha256 {actual[:12]}… ≠ registered {expected[:12]}…")
        return path
