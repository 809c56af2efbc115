"""The HTTP front door (FastAPI; the score route on bare ASGI in front of it): a thin adapter over the scorer core.

* ``POST /v1/score``: a ScoreRequest in, a PredictionRecord out. A request the scorer cannot take
  gets its ``ScoringError``'s status (``online/errors.py``): 422 names the request field at fault,
  413 a body over the limit, 404 an unknown model, 503 overloaded or not ready (retry later: its
  ``Retry-After`` says when),
  401 a missing or wrong bearer token; 500 only for a fault of the scorer.
* ``GET /v1/models/status``: the model serving under each alias. ``GET /v1/models/ready``: 200 only
  once a prod model is loaded and warm (503 before; so is a score request).
* ``GET /v1/health/live``: 200 while every door makes progress; 503 naming a door that has held
  work without finishing any for longer than ``stall_after_s`` (an orchestrator's liveness probe
  restarts such a process). ``GET /metrics``: Prometheus.

Run as one of several workers sharing the port (``peers``, ``online/worker_peers.py``), the probes and
``/metrics`` answer for every worker: ready only while all are, live unless any has a stalled door, the
metrics of all combined.

With ``auth_token`` set, score and model-status requests need ``Authorization: Bearer <token>``;
health and metrics stay open for probes and scrapers. One log line per request (request id,
latency, status, and its trace id when requests are traced: ``online/tracing.py``, which also reads a
caller's ``traceparent`` header); the full stack trace only for a fault of the scorer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from online.asgi_route import ClientDisconnected, RouteInFront
from online.errors import ScoringError, Unauthenticated
from online.metrics_merge import merge_expositions
from online.prediction_log import PredictionLog
from online.request_limits import RequestLimits, parse_request
from online.scorer import Scorer
from online.tracing import RequestTrace, RequestTracer, log_suffix
from online.worker_peers import WorkerPeers, decode_stalled, encode_stalled
from schemas.validation import encode

log = logging.getLogger(__name__)


def bearer_check(token: str | None) -> Callable[[str | None], None]:
    """A check of an ``Authorization`` header value against ``token`` (no check when None)."""
    expected = None if token is None else f"Bearer {token}".encode()

    def check(header: str | None) -> None:
        if expected is not None and not hmac.compare_digest((header or "").encode(), expected):
            raise Unauthenticated("missing or wrong bearer token (Authorization: Bearer <token>)")

    return check


def create_app(
    scorer: Scorer,
    prediction_log: PredictionLog | None = None,
    *,
    limits: RequestLimits = RequestLimits(),
    auth_token: str | None = None,
    stalled_doors: Callable[[], dict[str, float]] = dict,
    peers: WorkerPeers | None = None,
    tracer: RequestTracer | None = None,
) -> RouteInFront:
    """The HTTP API of ``scorer``; each scored request is appended to ``prediction_log`` when given, and traced by
    ``tracer`` when given.

    ``stalled_doors()`` names each door that holds work without progress, with for how many seconds. With
    ``peers`` the probes and metrics speak for every worker (``app.state.peer_answers`` are this one's answers).
    """
    app = FastAPI(title="Loopline scorer")
    requests = scorer.metrics.requests
    authorize = bearer_check(auth_token)
    counted: dict[int, Counter] = {}  # a metric child per status, looked up once

    async def score(
        headers: dict[bytes, bytes], body: Callable[[int], Awaitable[bytes]]
    ) -> tuple[int, bytes, Callable[[], None] | None]:
        began = time.perf_counter()
        request_id = "-"
        trace = None if tracer is None else tracer.begin(headers.get(b"traceparent"), began)
        try:
            authorization = headers.get(b"authorization")
            authorize(None if authorization is None else authorization.decode("latin-1"))
            request = parse_request(await body(limits.max_body_bytes), limits)
            request_id = request.request_id
            if trace is not None:
                trace.stage("receive", began, time.perf_counter())
            record = await scorer.score(request, trace)
            if prediction_log is None:
                answer = encode(record)
            elif trace is None:
                answer = await prediction_log.append(record)
            else:
                logging_at = time.perf_counter()
                answer = await prediction_log.append(record, trace.traceparent())
                trace.stage(
                    "log_prediction",
                    logging_at,
                    time.perf_counter(),
                    kind="PRODUCER",
                    **{"messaging.destination.name": prediction_log.topic, "loopline.prediction_log": prediction_log.mode},
                )
            status = 200
        except ClientDisconnected:
            log.info("a client went away before its request's body was in")
            raise
        except ScoringError as err:
            if err.http_status >= 500 and not err.retriable:
                log.exception("request %s failed", request_id)
            status, answer = err.http_status, json.dumps(err.answer()).encode()
        except Exception:
            log.exception("request %s failed", request_id)
            status, answer = 500, json.dumps({"error": "internal error", "request_id": request_id}).encode()
        if status not in counted:
            counted[status] = requests.labels("http", str(status))
        counted[status].inc()
        log.info("request %s %.2f ms %d%s", request_id, (time.perf_counter() - began) * 1000, status, log_suffix(trace))
        return status, answer, None if trace is None else _finisher(tracer, trace, request_id, status, time.perf_counter())

    def models() -> dict:
        return {
            alias: {"name": model.name, "version": model.version, "provider": model.provider}
            for alias, model in scorer.models.items()
        }

    @app.get("/v1/models/status")
    async def status(http_request: Request) -> Response:
        try:
            authorize(http_request.headers.get("authorization"))
        except Unauthenticated as err:
            return JSONResponse(err.answer(), status_code=err.http_status)
        return JSONResponse({"alive": True, "models": models(), "canary_share": scorer.canary_share})

    async def own_metrics() -> bytes:
        return generate_latest(scorer.metrics.collector_registry)

    async def own_ready() -> bytes:
        return b"1" if scorer.ready else b"0"

    async def own_stalled() -> bytes:
        return encode_stalled(stalled_doors())

    app.state.peer_answers = {"metrics": own_metrics, "ready": own_ready, "stalled": own_stalled}

    @app.get("/v1/models/ready")
    async def ready() -> Response:
        ready = scorer.ready
        if ready and peers is not None:
            ready = all(answer == b"1" for answer in await peers.ask_siblings("ready"))
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/v1/health/live")
    async def live() -> Response:
        stalled = stalled_doors()
        if peers is not None:
            for door, seconds in decode_stalled(await peers.ask_siblings("stalled")).items():
                stalled[door] = max(seconds, stalled.get(door, 0.0))
        return JSONResponse({"live": not stalled, "stalled_s": stalled}, status_code=503 if stalled else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = await own_metrics()
        if peers is not None:
            siblings = [answer.decode() for answer in await peers.ask_siblings("metrics") if answer]
            text = merge_expositions([text.decode(), *siblings])
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    # The hot path on the bare ASGI interface (online/asgi_route.py): FastAPI serves the rest.
    return RouteInFront(app, "POST", "/v1/score", score)


def _finisher(tracer: RequestTracer, trace: RequestTrace, request_id: str, status: int, answered_at: float) -> Callable[[], None]:
    """What ends a request's trace once its answer is sent (the ``respond`` stage: from its answer being ready)."""

    def finish() -> None:
        sent_at = time.perf_counter()
        trace.stage("respond", answered_at, sent_at)
        tracer.finish(
            trace,
            "POST /v1/score",
            "SERVER",
            sent_at,
            error=None if status == 200 else str(status),
            **{
                "loopline.request_id": request_id,
                "http.request.method": "POST",
                "http.route": "/v1/score",
                "http.response.status_code": status,
            },
        )

    return finish


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the process's shutdown is the serving process's to run), and with a
    moment between closing the listeners and closing idle connections."""

    #: uvicorn closes every connection with no request under way at once; one accepted just before, whose request is
    #: still in the socket buffer, would be closed unanswered. This long lets such requests be read first.
    accepted_grace_s = 0.05

    def capture_signals(self):  # uvicorn's hook
        return contextlib.nullcontext()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:  # uvicorn's hook
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await asyncio.sleep(self.accepted_grace_s)
        await super().shutdown(sockets)


class HttpDoor:
    """The HTTP door: ``app`` served on ``host:port`` by uvicorn; one of several workers on that port when
    ``peers`` is given (the port bound with SO_REUSEPORT, the siblings answered while it runs)."""

    name = "http"

    def __init__(self, app: RouteInFront, host: str, port: int, peers: WorkerPeers | None = None) -> None:
        self.app, self.host, self.port, self.peers = app, host, port, peers

    def stalled_s(self) -> float:
        """Never stalled: each request is answered or times out on its own."""
        return 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (or the server fails to start, e.g. its port is taken)."""
        server = _Server(uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning"))
        sockets = None
        try:
            if self.peers is not None:
                await self.peers.start(self.app.state.peer_answers)
                sockets = [_shared_socket(self.host, self.port)]
            serving = asyncio.ensure_future(server.serve(sockets))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([serving, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            server.should_exit = True
            await serving
        finally:
            if self.peers is not None:
                await self.peers.close()


def _shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that the other workers bind too (the kernel spreads connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
