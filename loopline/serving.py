"""`loopline serve`: the scorer assembled from settings, behind its front doors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from pathlib import Path

from loopline.settings import Settings
from online.features import FeatureFetcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.result_cache import ResultCache
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
    cache = None
    if serving.result_cache_ttl_s is not None:
        cache = ResultCache(settings.redis_address, serving.result_cache_ttl_s, timeout_s=budget_s)
    return Scorer(model, FeatureFetcher(reader, features, budget_s), knobs, ScorerMetrics(), cache)


def serve(settings: Settings, model_path: Path, doors: Collection[str]) -> None:
    """Serve one scorer through ``doors`` ("http", "kafka", "grpc") until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(run_doors(settings, build_scorer(settings, model_path), doors, asyncio.Event()))


async def run_doors(settings: Settings, scorer: Scorer, doors: Collection[str], stop: asyncio.Event) -> None:
    """Serve ``scorer`` through ``doors`` on this event loop until ``stop`` is set or a door fails.

    All doors share the loop, hence one dynamic batcher: requests from every door batch together.
    """
    import uvicorn

    from online.grpc_door import create_server
    from online.http_app import create_app
    from online.kafka_door import KafkaScoringDoor
    from online.prediction_log import PredictionLog
    from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS

    serving = settings.serving
    running = [asyncio.ensure_future(stop.wait())]
    http = grpc = None
    predictions = None
    if serving.log_predictions and ({"http", "grpc"} & set(doors)):
        failures = scorer.metrics.prediction_log_failures
        predictions = PredictionLog(settings.kafka.bootstrap_servers, PREDICTIONS.name, failures)
    if "kafka" in doors:
        door = KafkaScoringDoor(
            scorer, settings.kafka.bootstrap_servers, serving.kafka_group_id, SCORE_REQUESTS.name, PREDICTIONS.name,
            DEAD_LETTERS.name, transactional_id=f"{serving.kafka_group_id}-{serving.instance}",
        )  # fmt: skip
        running.append(asyncio.ensure_future(door.run(stop)))
    if "http" in doors:
        http = uvicorn.Server(uvicorn.Config(create_app(scorer, predictions), host=serving.host, port=serving.http_port, log_level="warning"))
        running.append(asyncio.ensure_future(http.serve()))
    if "grpc" in doors:
        grpc = create_server(scorer, f"{serving.host}:{serving.grpc_port}", predictions)
        await grpc.start()
        running.append(asyncio.ensure_future(grpc.wait_for_termination()))
    done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    if http is not None:
        http.should_exit = True
    if grpc is not None:
        await grpc.stop(grace=1.0)
    await asyncio.gather(*running, return_exceptions=True)
    await scorer.close()
    if predictions is not None:
        predictions.close()
    for task in done:
        task.result()  # a door that failed takes the process down with its error
