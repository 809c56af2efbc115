"""The gRPC front door (``schemas/scoring.proto``): a thin adapter over the scorer core."""

from __future__ import annotations

import logging
import time

import grpc
from google.protobuf import struct_pb2
from pydantic import ValidationError

from online.batcher import Overloaded
from online.prediction_log import PredictionLog
from online.scorer import ModelNotReady, RequestError, Scorer
from schemas.grpc_api import scoring_api
from schemas.records import PredictionRecord, ScoreRequest

log = logging.getLogger("loopline.scoring")
DOOR = "grpc"


def _python(value: struct_pb2.Value):
    kind = value.WhichOneof("kind")
    return None if kind in (None, "null_value") else getattr(value, kind)


def _proto(value) -> struct_pb2.Value:
    if value is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, str):
        return struct_pb2.Value(string_value=value)
    return struct_pb2.Value(number_value=value)


def request_from_proto(message) -> ScoreRequest:
    """The contract's ScoreRequest for a gRPC message (ValidationError when it breaks the contract)."""
    return ScoreRequest(
        schema_version=ScoreRequest.SCHEMA_VERSION,
        request_id=message.request_id,
        entity_keys=dict(message.entity_keys),
        request_fields={name: _python(value) for name, value in message.request_fields.items()},
        requested_at_ms=message.requested_at_ms,
        model_name=message.model_name or None,
    )


def prediction_to_proto(record: PredictionRecord):
    """The gRPC Prediction for a prediction record."""
    messages, _ = scoring_api()
    return messages.Prediction(
        request_id=record.request_id,
        entity_keys=record.entity_keys,
        features={name: _proto(value) for name, value in record.features.items()},
        defaulted_features=record.defaulted_features,
        model_name=record.model_name,
        model_version=record.model_version,
        score=record.score,
        stage_latency_ms=record.stage_latency_ms,
        requested_at_ms=record.requested_at_ms,
        scored_at_ms=record.scored_at_ms,
    )


def create_server(scorer: Scorer, address: str, prediction_log: PredictionLog | None = None) -> grpc.aio.Server:
    """An asyncio gRPC server for ``scorer`` bound to ``address`` (host:port); start it with ``await server.start()``.

    Each scored request is appended to ``prediction_log`` when given.
    """
    _, services = scoring_api()

    class Servicer(services.ScorerServicer):
        async def Score(self, message, context):  # noqa: N802 - the proto's method name
            began, status = time.perf_counter(), "200"
            try:
                record = await scorer.score(request_from_proto(message))
                if prediction_log is not None:
                    prediction_log.append(record)
                return prediction_to_proto(record)
            except ValidationError as err:
                status, first = "422", err.errors(include_url=False)[0]
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
            except RequestError as err:
                status = "422"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except Overloaded as err:
                status = "503"
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
            except ModelNotReady as err:
                status = "503"
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            finally:
                scorer.metrics.requests.labels(DOOR, status).inc()
                log.info("request %s %.2f ms %s", message.request_id or "-", (time.perf_counter() - began) * 1000, status)

    server = grpc.aio.server()
    services.add_ScorerServicer_to_server(Servicer(), server)
    server.add_insecure_port(address)
    return server
