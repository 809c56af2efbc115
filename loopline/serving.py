"""`loopline serve`: the scorer assembled from settings, behind its front doors."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator
from pathlib import Path
from signal import SIGINT, SIGTERM

import uvloop

from loopline.settings import Settings
from online.batcher import BatchingKnobs
from online.doors import FrontDoor, serve_doors, stalled_doors
from online.hot_swap import ModelWatcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.prediction_log import PredictionLog
from online.request_limits import RequestLimits
from online.result_cache import ResultCache
from online.scorer import Scorer
from online.tracing import RequestTracer
from online.vllm_runtime import VllmModel
from schemas.model_contract import ModelInput
from schemas.model_registry import PROD_ALIAS

log = logging.getLogger(__name__)
#: One of several worker processes sharing the ports: (its index from 0, how many there are).
Worker = tuple[int, int]


def build_scorer(settings: Settings, model_path: Path | None = None) -> Scorer:
    """A scorer reading features from the settings' online store; serving the file ``model_path`` when given
    (else nothing until a ``ModelWatcher`` installs the model registry's versions)."""
    from feature_store.online_read import OnlineReader

    serving = settings.serving
    budget_s = serving.feature_budget_ms / 1000
    reader = OnlineReader(
        settings.feast_registry_path,
        settings.redis_connection,
        settings.repo_path,
        # Past the budget the request goes on without the read (its own timeout, on the same event loop): the
        # connection's is longer, so a read over budget is told from Redis unavailable, and a hung one still ends.
        timeout_s=2 * budget_s,
        redis_cluster=settings.redis_cluster,
        stale_after_s=serving.stale_after_s,
    )
    knobs = BatchingKnobs(
        max_batch_size=serving.max_batch_size,
        max_queue_delay_s=serving.max_queue_delay_ms / 1000,
        max_queue_size=serving.max_queue_size,
        preferred_batch_sizes=tuple(serving.preferred_batch_sizes),
    )
    cache = None
    if serving.result_cache_ttl_s is not None:
        cache = ResultCache(
            settings.redis_connection, serving.result_cache_ttl_s, timeout_s=budget_s, redis_cluster=settings.redis_cluster
        )
    model = OnnxModel(model_path, serving.model_name, serving.model_version) if model_path is not None else None
    return Scorer(
        reader,
        budget_s,
        knobs,
        ScorerMetrics(),
        cache,
        model=model,
        feature_batch_size=serving.feature_batch_size,
        max_in_flight=serving.max_in_flight,
    )


def request_tracer(settings: Settings, worker: Worker | None = None) -> RequestTracer | None:
    """The scorer's request tracer (None with tracing off), exporting to the settings' OTLP endpoint, else the
    stack's Jaeger."""
    tracing = settings.serving.tracing
    if not tracing.enabled:
        return None
    attributes = {
        "service.instance.id": settings.serving.instance if worker is None else f"{settings.serving.instance}-{worker[0]}"
    }
    return RequestTracer(
        tracing.otlp_endpoint or settings.jaeger.otlp_traces_url,
        service=tracing.service_name,
        sample_ratio=tracing.sample_ratio,
        slow_ms=tracing.slow_ms,
        max_tail_per_s=tracing.max_tail_per_s,
        attributes=attributes,
    )


def model_watcher(settings: Settings, scorer: Scorer) -> ModelWatcher:
    """Keeps ``scorer`` on the versions the model registry's aliases name for the settings' model."""
    from loopline.components import model_registry_reader

    return ModelWatcher(model_registry_reader(settings), scorer, settings.serving.model_registry_poll_s)


def llm_model(settings: Settings) -> VllmModel:
    """The LLM the settings name, as a client of its vLLM server."""
    llm, serving = settings.serving.llm, settings.serving
    return VllmModel(
        llm.base_url,
        llm.served_model,
        serving.model_name,
        serving.model_version,
        [ModelInput(name) for name in llm.inputs],
        llm.prompt,
        answers=tuple(llm.answers),
        max_concurrency=llm.max_concurrency,
        max_queue_size=serving.max_queue_size,
        timeout_s=llm.timeout_ms / 1000,
    )


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


def serve(settings: Settings, model_path: Path | None, doors: Collection[str], worker: Worker | None = None) -> None:
    """Serve through ``doors`` ("http", "kafka", "grpc") until SIGINT or SIGTERM: the file ``model_path`` when
    given, else the LLM of ``serving.llm`` when set, else the model registry's ``prod`` (and ``canary``)
    versions of the settings' model, hot-swapped. ``worker``: (index, count) when this process is one of
    several sharing the ports (``loopline/serve_workers.py``).

    The first signal stops the doors cleanly (the Kafka door commits what it scored and leaves its
    group); if that takes longer than ``serving.shutdown_timeout_s``, or a second signal comes, the
    process exits at once (the deadline runs on a thread of its own, whatever the event loop does).
    """
    who = "" if worker is None else f"worker {worker[0]} "
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {who}%(name)s %(message)s")
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
        _watch_signals(asyncio.get_running_loop(), stop, settings.serving.shutdown_timeout_s)
        await run_doors(settings, scorer, doors, stop, install_models, worker)

    # uvloop: the event loop every request's I/O and wake-ups go through, in C (uvicorn's own choice when installed).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(until_signalled())


def _watch_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, timeout_s: float) -> None:
    """On SIGINT/SIGTERM set ``stop``; exit by force after ``timeout_s`` or at a second signal."""
    received: list[int] = []

    def on_signal(number: int, _frame) -> None:
        received.append(number)
        if len(received) > 1:
            _exit_now(f"second {signal.Signals(number).name}")
        log.info("%s: stopping (at most %.0f s)", signal.Signals(number).name, timeout_s)
        loop.call_soon_threadsafe(stop.set)
        deadline = threading.Timer(timeout_s, _exit_now, ("shutdown took longer than serving.shutdown_timeout_s",))
        deadline.daemon = True
        deadline.start()

    for number in (SIGINT, SIGTERM):
        signal.signal(number, on_signal)


def _exit_now(why: str) -> None:
    log.error("exiting at once: %s", why)
    logging.shutdown()
    os._exit(1)


@contextlib.contextmanager
def doors_in_thread(
    settings: Settings,
    scorer: Scorer,
    doors: Collection[str],
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
) -> Iterator[None]:
    """``run_doors`` on an event loop of its own in a thread, for the duration of the block (the tests
    run the scorer beside their own work this way)."""
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


def front_doors(
    settings: Settings,
    scorer: Scorer,
    doors: Collection[str],
    prediction_log: PredictionLog | None,
    worker: Worker | None = None,
    tracer: RequestTracer | None = None,
) -> list[FrontDoor]:
    """The doors named in ``doors`` ("http", "kafka", "grpc"), configured from ``settings``; those of one of
    several workers when ``worker`` is given; each traces its requests with ``tracer`` when given."""
    from online.grpc_door import GrpcDoor
    from online.http_app import HttpDoor, create_app
    from online.kafka_door import KafkaScoringDoor
    from online.kafka_door_at_least_once import AtLeastOnceKafkaDoor
    from online.kafka_scoring import RequestScoring
    from online.worker_peers import WorkerPeers
    from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS

    serving = settings.serving
    limits = RequestLimits(**serving.limits.model_dump())
    # Each worker's transactions are its own: a restarted worker fences only its own predecessor.
    member = serving.instance if worker is None else f"{serving.instance}-{worker[0]}"
    peers = None if worker is None else WorkerPeers(f"{serving.host}:{serving.http_port}", *worker)
    built: list[FrontDoor] = []
    if "kafka" in doors:
        scoring = RequestScoring(
            scorer, SCORE_REQUESTS.name, PREDICTIONS.name, DEAD_LETTERS.name, limits, serving.max_in_flight, tracer=tracer
        )
        kafka = {
            "bootstrap_servers": settings.kafka.bootstrap,
            "group_id": serving.kafka_group_id,
            "client_config": settings.kafka.client_config,
            "broker_timeout_s": serving.kafka_broker_timeout_s,
            "commit_interval_s": serving.kafka_commit_interval_ms / 1000,
        }
        if serving.kafka_delivery == "at_least_once":
            built.append(AtLeastOnceKafkaDoor(scoring, **kafka))
        else:
            built.append(KafkaScoringDoor(scoring, transactional_id=f"{serving.kafka_group_id}-{member}", **kafka))
    if "grpc" in doors:
        address = f"{serving.host}:{serving.grpc_port}"
        built.append(GrpcDoor(scorer, address, prediction_log, limits=limits, auth_token=settings.auth_token, tracer=tracer))
    if "http" in doors:
        app = create_app(
            scorer,
            prediction_log,
            limits=limits,
            auth_token=settings.auth_token,
            stalled_doors=lambda: stalled_doors(built, serving.stall_after_s),
            peers=peers,
            tracer=tracer,
        )
        built.append(HttpDoor(app, serving.host, serving.http_port, peers))
    return built


async def run_doors(
    settings: Settings,
    scorer: Scorer,
    doors: Collection[str],
    stop: asyncio.Event,
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    worker: Worker | None = None,
) -> None:
    """Serve ``scorer`` through ``doors`` on this event loop until ``stop`` is set or a door fails;
    ``install_models(stop)``, when given, runs meanwhile (the model registry watcher, a vLLM warm-up);
    ``worker``: (index, count) of one of several workers sharing the ports.

    All doors share the loop, hence one dynamic batcher per model: requests from every door batch together.
    Afterwards the scorer finishes its requests in flight and the prediction log delivers what it holds.
    """
    from schemas.topics import PREDICTIONS

    serving = settings.serving
    prediction_log = None
    if serving.prediction_log != "off" and {"http", "grpc"} & set(doors):
        prediction_log = PredictionLog(
            bootstrap_servers=settings.kafka.bootstrap,
            topic=PREDICTIONS.name,
            failures=scorer.metrics.prediction_log_failures,
            mode=serving.prediction_log,
            ack_timeout_s=serving.prediction_log_ack_timeout_s,
            client_config=settings.kafka.client_config,
        )
    tracer = request_tracer(settings, worker)
    try:
        built = front_doors(settings, scorer, doors, prediction_log, worker, tracer)
        await serve_doors(built, stop, beside=[install_models(stop)] if install_models else [])
    finally:
        await scorer.close()
        if prediction_log is not None:
            await asyncio.to_thread(prediction_log.close)
        if tracer is not None:
            await asyncio.to_thread(tracer.close)
