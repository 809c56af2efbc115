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


def serve(settings: Settings, model_path: Path, http: bool, kafka: bool) -> None:
    """Serve one scorer through the chosen front doors until interrupted."""
    import asyncio
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_serve(settings, build_scorer(settings, model_path), http, kafka))


async def _serve(settings: Settings, scorer: Scorer, http: bool, kafka: bool) -> None:
    import asyncio

    import uvicorn

    from online.http_app import create_app
    from online.kafka_door import KafkaScoringDoor
    from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS

    serving, stop = settings.serving, asyncio.Event()
    doors = []
    if kafka:
        door = KafkaScoringDoor(
            scorer, settings.kafka.bootstrap_servers, serving.kafka_group_id, SCORE_REQUESTS.name, PREDICTIONS.name,
            DEAD_LETTERS.name, transactional_id=f"{serving.kafka_group_id}-{serving.instance}",
        )  # fmt: skip
        doors.append(door.run(stop))
    if http:
        server = uvicorn.Server(uvicorn.Config(create_app(scorer), host=serving.http_host, port=serving.http_port, log_level="warning"))
        doors.append(server.serve())
    tasks = [asyncio.ensure_future(door) for door in doors]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a door that failed takes the process down with its error
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
