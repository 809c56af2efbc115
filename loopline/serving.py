"""`loopline serve`: the scorer assembled from settings, behind its front doors."""

from __future__ import annotations

from pathlib import Path

from loopline.settings import Settings
from online.features import FeatureFetcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.scorer import BatchingKnobs, Scorer
from schemas.model_contract import REQUEST_PREFIX


def build_scorer(settings: Settings, model_path: Path) -> Scorer:
    """A scorer for the model at ``model_path``, reading features from the settings' online store."""
    from feature_store.online_read import OnlineReader

    serving = settings.serving
    model = OnnxModel(model_path, serving.model_name, serving.model_version)
    budget_s = serving.feature_budget_ms / 1000
    reader = OnlineReader(settings.registry_path, settings.redis_address, timeout_s=budget_s)
    features = [name for name in model.inputs if not name.startswith(REQUEST_PREFIX)]
    knobs = BatchingKnobs(
        max_batch_size=serving.max_batch_size,
        max_queue_delay_s=serving.max_queue_delay_ms / 1000,
        max_queue_size=serving.max_queue_size,
        preferred_batch_sizes=tuple(serving.preferred_batch_sizes),
    )
    return Scorer(model, FeatureFetcher(reader, features, budget_s), knobs, ScorerMetrics())


def serve_http(settings: Settings, model_path: Path) -> None:
    """Serve the scorer over HTTP until interrupted."""
    import logging

    import uvicorn

    from online.http_app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    app = create_app(build_scorer(settings, model_path))
    uvicorn.run(app, host=settings.serving.http_host, port=settings.serving.http_port, log_level="warning")
