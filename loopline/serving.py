"""`loopline serve`: the scorer assembled from settings, behind its front doors."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator
from pathlib import Path
from signal import SIGINT, SIGTERM

from loopline.settings import Settings
from online.batcher import BatchingKnobs
from online.hot_swap import ModelWatcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.result_cache import ResultCache
from online.scorer import Scorer
from online.vllm_runtime import VllmModel
from schemas.model_registry import PROD_ALIAS

log = logging.getLogger("loopline.scoring")


def build_scorer(settings: Settings, model_path: Path | None = None) -> Scorer:
    """A scorer reading features from the settings' online store; serving the file ``model_path`` when given
    (else nothing until a ``ModelWatcher`` installs the registry's versions)."""
    from feature_store.online_read import OnlineReader

    serving = settings.serving
    budget_s = serving.feature_budget_ms / 1000
    reader = OnlineReader(settings.registry_path, settings.redis_address, timeout_s=budget_s)
    knobs = BatchingKnobs(
        max_batch_size=serving.max_batch_size,
        max_queue_delay_s=serving.max_queue_delay_ms / 1000,
        max_queue_size=serving.max_queue_size,
        preferred_batch_sizes=tuple(serving.preferred_batch_sizes),
    )
    cache = None
    if serving.result_cache_ttl_s is not None:
        cache = ResultCache(settings.redis_address, serving.result_cache_ttl_s, timeout_s=budget_s)
    model = OnnxModel(model_path, serving.model_name, serving.model_version) if model_path is not None else None
    return Scorer(reader, budget_s, knobs, ScorerMetrics(), cache, model=model)


def model_watcher(settings: Settings, scorer: Scorer) -> ModelWatcher:
    """Keeps ``scorer`` on the versions the registry's aliases name for the settings' model."""
    from loopline.components import registry_reader

    return ModelWatcher(registry_reader(settings), scorer, settings.serving.registry_poll_s)


def llm_model(settings: Settings) -> VllmModel:
    """The LLM the settings name, as a client of its vLLM server."""
    llm, serving = settings.serving.llm, settings.serving
    return VllmModel(
        llm.base_url, llm.served_model, serving.model_name, serving.model_version, llm.inputs, llm.prompt,
        answers=tuple(llm.answers), max_concurrency=llm.max_concurrency, max_queue_size=serving.max_queue_size,
        timeout_s=llm.timeout_ms / 1000,
    )  # fmt: skip


async def serve_when_warm(scorer: Scorer, model: VllmModel, stop: asyncio.Event, retry_s: float = 2.0) -> None:
    """Install ``model`` as prod once its server answers (a vLLM server takes minutes to load a model)."""
    while not stop.is_set():
        try:
            await model.warm_up()
        except Exception as err:
            log.warning("vLLM %s not ready yet (%s); retrying", model.served_model, err)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)
            continue
        await scorer.install(PROD_ALIAS, model)
        return


def serve(settings: Settings, model_path: Path | None, doors: Collection[str]) -> None:
    """Serve through ``doors`` ("http", "kafka", "grpc") until SIGINT or SIGTERM: the file ``model_path`` when
    given, else the LLM of ``serving.llm`` when set, else the registry's ``prod`` (and ``canary``)
    versions of the settings' model, hot-swapped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scorer = build_scorer(settings, model_path)
    if model_path is not None:
        install_models = None
    elif settings.serving.llm is not None:
        install_models = functools.partial(serve_when_warm, scorer, llm_model(settings))
    else:
        install_models = model_watcher(settings, scorer).run

    # Everything loaded so far (Feast, MLflow, pandas, the model: millions of objects) lives as long as
    # the process: frozen, the garbage collector stops walking it on every full collection, which
    # otherwise shows as tens of milliseconds in the latency tail.
    gc.collect()
    gc.freeze()

    async def until_signalled() -> None:
        stop = asyncio.Event()
        for signal in (SIGINT, SIGTERM):  # a clean stop: the Kafka door leaves its group, commits first
            asyncio.get_running_loop().add_signal_handler(signal, stop.set)
        await run_doors(settings, scorer, doors, stop, install_models)

    asyncio.run(until_signalled())


@contextlib.contextmanager
def doors_in_thread(
    settings: Settings,
    scorer: Scorer,
    doors: Collection[str],
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
) -> Iterator[None]:
    """``run_doors`` on an event loop of its own in a thread, for the duration of the block (the demo
    runs the scorer beside its other work this way; so do the tests)."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(run_doors(settings, scorer, doors, stop, install_models),))
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


async def run_doors(
    settings: Settings,
    scorer: Scorer,
    doors: Collection[str],
    stop: asyncio.Event,
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
) -> None:
    """Serve ``scorer`` through ``doors`` on this event loop until ``stop`` is set or a door fails;
    ``install_models(stop)``, when given, runs meanwhile (the registry watcher, a vLLM warm-up).

    All doors share the loop, hence one dynamic batcher per model: requests from every door batch together.
    """
    import uvicorn

    from online.grpc_door import create_server
    from online.http_app import create_app
    from online.kafka_door import KafkaScoringDoor
    from online.prediction_log import PredictionLog
    from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS

    serving = settings.serving
    running = [asyncio.ensure_future(stop.wait())]
    # Not among the running doors: it may finish (a model installed) while the doors go on.
    installing = asyncio.ensure_future(install_models(stop) if install_models else asyncio.sleep(0))
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
    await asyncio.gather(*running, installing, return_exceptions=True)
    await scorer.close()
    if predictions is not None:
        predictions.close()
    for task in done:
        task.result()  # a door that failed takes the process down with its error
