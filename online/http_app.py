"""The HTTP front door (FastAPI): a thin adapter over the scorer core.

* ``POST /v1/score``: a ScoreRequest in, a PredictionRecord out; 422 names the invalid field,
  503 says the scorer is overloaded (retry later).
* ``GET /v1/models/status``: liveness, and the model serving under each alias.
  ``GET /v1/models/ready``: 200 only once a prod model is loaded and warm (503 before; so is a
  score request). ``GET /metrics``: Prometheus.

One log line per request (request id, latency, status); the full trace only on an error.
"""

from __future__ import annotations

import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from online.batcher import Overloaded
from online.prediction_log import PredictionLog
from online.scorer import ModelNotReady, RequestError, Scorer
from schemas.records import ScoreRequest

log = logging.getLogger("loopline.scoring")


def create_app(scorer: Scorer, prediction_log: PredictionLog | None = None) -> FastAPI:
    """The HTTP API of ``scorer``; each scored request is appended to ``prediction_log`` when given."""
    app = FastAPI(title="Loopline scorer")
    requests = scorer.metrics.requests

    async def score(http_request: Request) -> Response:
        began = time.perf_counter()
        request_id = "-"
        try:
            request = ScoreRequest.model_validate_json(await http_request.body())
            request_id = request.request_id
            record = await scorer.score(request)
            if prediction_log is not None:
                prediction_log.append(record)
            status, body = 200, record.model_dump_json()
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            status = 422
            body = json.dumps({"error": "invalid request", "field": ".".join(map(str, first["loc"])), "reason": first["msg"]})
        except RequestError as err:
            status, body = 422, json.dumps({"error": "invalid request", "field": err.field, "reason": str(err)})
        except Overloaded as err:
            status, body = 503, json.dumps({"error": "overloaded", "reason": str(err)})
        except ModelNotReady as err:
            status, body = 503, json.dumps({"error": "not ready", "reason": str(err)})
        except Exception:
            log.exception("request %s failed", request_id)
            status, body = 500, json.dumps({"error": "internal error", "request_id": request_id})
        requests.labels("http", str(status)).inc()
        log.info("request %s %.2f ms %d", request_id, (time.perf_counter() - began) * 1000, status)
        return Response(body, status_code=status, media_type="application/json")

    # The hot path is a plain Starlette route: it reads and writes JSON itself (pydantic, one pass),
    # so FastAPI's per-request dependency and response handling would be pure overhead.
    app.add_route("/v1/score", score, methods=["POST"])

    def models() -> dict:
        return {
            alias: {"name": model.name, "version": model.version, "provider": model.provider}
            for alias, model in scorer.models.items()
        }

    @app.get("/v1/models/status")
    async def status() -> dict:
        return {"alive": True, "models": models(), "canary_share": scorer.canary_share}

    @app.get("/v1/models/ready")
    async def ready() -> Response:
        return JSONResponse({"ready": scorer.ready, "models": models()}, status_code=200 if scorer.ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(scorer.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
