"""Score requests as a client sends them, and the scorer's doors run in a thread for a test to call."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from infra.service import free_port, wait_until
from loopline.job_processes import start_scorer
from loopline.serving import doors_in_thread
from loopline.settings import Settings
from online.scorer import Scorer
from schemas.records import ScoreRequest
from schemas.topics import SCORE_REQUESTS
from schemas.validation import encode
from streams.world import Emitted
from tests.support.kafka_log import start_group_at_end


def score_request(user: str, amount: float) -> dict:
    """A score request (as JSON-ready data) for ``user`` with the request field ``amount``, a fresh id."""
    return ScoreRequest(
        schema_version=ScoreRequest.SCHEMA_VERSION,
        request_id=str(uuid.uuid4()),
        entity_keys={"user_id": user},
        request_fields={"amount": amount},
        requested_at_ms=int(time.time() * 1000),
    ).model_dump()


def start_http_and_kafka_scorer(
    settings: Settings, model: Path, log_file: Path, group_prefix: str, **extra_env: str
) -> tuple[subprocess.Popen, str, str]:
    """`loopline serve --http --kafka` on ``model``, on a free port, its Kafka door in a group of its own that starts
    at the requests' end (so it scores only what the test sends from now on): (its process, its url, its group)."""
    port, group = free_port(), f"{group_prefix}-{uuid.uuid4().hex[:8]}"
    start_group_at_end(settings.kafka.bootstrap, group, SCORE_REQUESTS.name)
    server = start_scorer(
        settings,
        ["--http", "--kafka"],
        log_file,
        LOOPLINE_SERVING__HTTP_PORT=str(port),
        LOOPLINE_SERVING__MODEL_PATH=str(model),
        LOOPLINE_SERVING__KAFKA_GROUP_ID=group,
        **extra_env,
    )
    return server, f"http://127.0.0.1:{port}", group


def score_requests(users: list[str], rate_per_s: float, run_id: str) -> Iterator[Emitted]:
    """Score requests ``<run_id>-<n>`` for ``users`` in turn (``score_request``'s, amounts from a few), paced at
    ``rate_per_s`` (each stamped as it is drawn, i.e. as the producer sends it): a load on the Kafka door."""
    emit_at_ms = time.time() * 1000
    for n in itertools.count():
        emit_at_ms += 1000 / rate_per_s
        request = ScoreRequest(**{**score_request(users[n % len(users)], float(10 + n % 300)), "request_id": f"{run_id}-{n}"})
        yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), int(emit_at_ms), request)


@contextmanager
def serving_doors(
    settings: Settings,
    scorer: Scorer,
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    kafka: bool = False,
) -> Iterator[tuple[str, str]]:
    """The scorer's HTTP and gRPC doors (and with ``kafka``, its Kafka door as a new consumer group that
    starts at the end of ``scoring.requests``) on free ports, on one event loop in a thread:
    (http url, grpc address). ``install_models(stop)`` runs beside them (see ``run_doors``)."""
    serving = {"http_port": free_port(), "grpc_port": free_port(), "kafka_group_id": f"doors-{uuid.uuid4().hex[:8]}"}
    settings = settings.model_copy(update={"serving": settings.serving.model_copy(update=serving)})
    if kafka:
        start_group_at_end(settings.kafka.bootstrap, settings.serving.kafka_group_id, SCORE_REQUESTS.name)
    url = f"http://127.0.0.1:{settings.serving.http_port}"

    def up() -> bool:
        try:
            return requests.get(f"{url}/v1/health/live", timeout=1).ok
        except requests.ConnectionError:
            return False

    with doors_in_thread(settings, scorer, {"http", "grpc", "kafka"} if kafka else {"http", "grpc"}, install_models):
        assert wait_until(up, 20, 0.05), "the doors did not start"
        yield url, f"127.0.0.1:{settings.serving.grpc_port}"
