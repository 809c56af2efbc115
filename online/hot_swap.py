"""Hot swap: keep the scorer's aliases on the versions the model registry names.

The watcher polls the model registry. When an alias names a new version it downloads the artifact,
verifies its SHA-256 against the registration, loads and warms it off the event loop (serving goes
on meanwhile), then installs it: the switch is atomic and requests in flight finish on the model
that took them. A version that fails verification or loading is refused — counted in
``loopline_scoring_model_refusals_total`` (which an alert rule watches), logged with its reason,
and not tried again — and the model already serving keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path

from online.model_registry_reader import ArtifactRefused, ModelRegistryReader
from online.onnx_runtime import OnnxModel
from online.scorer import Scorer
from schemas.model_registry import ALIASES, PROD_ALIAS

log = logging.getLogger(__name__)


class ModelWatcher:
    """Installs in ``scorer`` the versions ``model_registry``'s aliases name, checking every ``poll_s`` seconds."""

    def __init__(self, model_registry: ModelRegistryReader, scorer: Scorer, poll_s: float = 5.0) -> None:
        self.model_registry = model_registry
        self.scorer = scorer
        self.poll_s = poll_s
        self._refused: set[str] = set()

    def _load(self, version: str) -> OnnxModel:
        """The verified, loaded and warmed model of ``version`` (blocking: runs on a worker thread).

        ArtifactRefused for a version that must not be served; any other error (the registry or its
        artifact store unreachable) is left to the next poll."""
        with tempfile.TemporaryDirectory(prefix="loopline-model-") as folder:
            path = self.model_registry.fetch(version, Path(folder))
            try:
                return OnnxModel(path, self.model_registry.name, version)
            except Exception as err:  # ONNX Runtime's load errors, or inputs not named per the contract
                raise ArtifactRefused(self.model_registry.name, version, f"not a servable model: {err}", "invalid_model") from err

    def _serving(self) -> str:
        """The versions serving now, for log lines."""
        return ", ".join(f"{alias} v{model.version}" for alias, model in self.scorer.models.items()) or "no model"

    def _refuse(self, refusal: ArtifactRefused) -> None:
        self._refused.add(refusal.version)
        self.scorer.metrics.model_refusals.labels(refusal.kind).inc()
        log.error("%s; still serving %s", refusal, self._serving())

    async def sync(self) -> None:
        """One look at the model registry; installs and removes models until the scorer matches it."""
        assignment = await asyncio.to_thread(self.model_registry.assignment)
        self.scorer.canary_share = assignment.canary_share
        for alias in ALIASES:
            version, serving = assignment.version(alias), self.scorer.models
            if version is None:
                if alias != PROD_ALIAS:  # prod keeps its last version: a registry slip never leaves nothing to serve
                    await self.scorer.remove(alias)
                continue
            if alias in serving and serving[alias].version == version or version in self._refused:
                continue
            loaded = next((model for model in serving.values() if model.version == version), None)
            if loaded is None:
                try:
                    loaded = await asyncio.to_thread(self._load, version)
                except ArtifactRefused as refusal:
                    self._refuse(refusal)
                    continue
            await self.scorer.install(alias, loaded)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set. A model registry that cannot be reached is logged; serving goes on."""
        while not stop.is_set():
            try:
                await self.sync()
            except Exception as err:
                log.warning("model registry not readable (%s); serving on with %s", err, self._serving())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
