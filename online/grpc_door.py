"""The gRPC front door (``schemas/scoring.proto``): a thin adapter over the scorer core.

A request the scorer cannot take is aborted with its ``ScoringError``'s code (``online/errors.py``):
INVALID_ARGUMENT names the field at fault, RESOURCE_EXHAUSTED means overloaded (or a message over
``limits.max_body_bytes``), UNAVAILABLE not ready, NOT_FOUND an unknown model, UNAUTHENTICATED a
missing or wrong bearer token (metadata ``authorization: Bearer <token>``), INTERNAL a fault of the
scorer. Each outcome is counted under its code. The server also serves the standard
``grpc.health.v1.Health`` service (SERVING once a prod model is warm) and server reflection, for
``grpcurl`` and orchestrators' gRPC probes.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from online.errors import InvalidRequest, ScoringError
from online.http_app import bearer_check
from online.prediction_log import PredictionLog
from online.request_limits import RequestLimits, check_limits
from online.scorer import Scorer
from online.tracing import RequestTracer, log_suffix
from schemas.grpc_api import scoring_api
from schemas.records import PredictionRecord, ScoreRequest
from schemas.validation import ContractViolation, validate

log = logging.getLogger(__name__)
DOOR = "grpc"
SERVICE = "loopline.scoring.v1.Scorer"


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


def request_from_proto(message, limits: RequestLimits = RequestLimits()) -> ScoreRequest:
    """The contract's ScoreRequest for a gRPC message; InvalidRequest naming the field that breaks it."""
    try:
        request = validate(
            ScoreRequest,
            {
                "schema_version": ScoreRequest.SCHEMA_VERSION,
                "request_id": message.request_id,
                "entity_keys": dict(message.entity_keys),
                "request_fields": {name: _python(value) for name, value in message.request_fields.items()},
                "requested_at_ms": message.requested_at_ms,
                "model_name": message.model_name or None,
                "event_id": message.event_id or None,
            },
        )
    except ContractViolation as violation:
        raise InvalidRequest(violation.field, violation.reason) from None
    check_limits(request, limits)
    return request


def prediction_to_proto(record: PredictionRecord):
    """The gRPC Prediction for a prediction record."""
    messages, _ = scoring_api()
    return messages.Prediction(
        request_id=record.request_id,
        entity_keys=record.entity_keys,
        features={name: _proto(value) for name, value in record.features.items()},
        defaulted_features=record.defaulted_features,
        defaulted_reasons=record.defaulted_reasons,
        model_name=record.model_name,
        model_version=record.model_version,
        score=record.score,
        stage_latency_ms=record.stage_latency_ms,
        requested_at_ms=record.requested_at_ms,
        scored_at_ms=record.scored_at_ms,
        event_id=record.event_id or "",
        trace_id=record.trace_id or "",
    )


class GrpcDoor:
    """The gRPC door on ``address`` (host:port); each scored request is appended to ``prediction_log`` when given, and
    traced by ``tracer`` when given (a caller's ``traceparent`` read from the call's metadata)."""

    name = "grpc"

    def __init__(
        self,
        scorer: Scorer,
        address: str,
        prediction_log: PredictionLog | None = None,
        *,
        limits: RequestLimits = RequestLimits(),
        auth_token: str | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        self.scorer, self.address, self.prediction_log = scorer, address, prediction_log
        self.limits, self.auth_token, self.tracer = limits, auth_token, tracer

    def stalled_s(self) -> float:
        """Never stalled: each call is answered or times out on its own."""
        return 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; calls in flight get a second to finish."""
        _, services = scoring_api()
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", self.limits.max_body_bytes)])
        services.add_ScorerServicer_to_server(self._servicer(services.ScorerServicer), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        server.add_insecure_port(self.address)
        await server.start()
        reporting = asyncio.ensure_future(_report_health(self.scorer, health_servicer))
        try:
            await stop.wait()
        finally:
            reporting.cancel()
            await server.stop(grace=1.0)

    def _servicer(self, base: type):
        scorer, prediction_log, limits, tracer = self.scorer, self.prediction_log, self.limits, self.tracer
        authorize = bearer_check(self.auth_token)

        class Servicer(base):
            async def Score(self, message, context):  # the proto's method name, as gRPC dispatches it
                began, code = time.perf_counter(), grpc.StatusCode.OK
                metadata = dict(context.invocation_metadata())
                trace = None if tracer is None else tracer.begin(metadata.get("traceparent"), began)
                try:
                    authorize(metadata.get("authorization"))
                    request = request_from_proto(message, limits)
                    if trace is not None:
                        trace.stage("receive", began, time.perf_counter())
                    record = await scorer.score(request, trace)
                    if prediction_log is not None:
                        logging_at = time.perf_counter()
                        await prediction_log.append(record, None if trace is None else trace.traceparent())
                        if trace is not None:
                            trace.stage(
                                "log_prediction",
                                logging_at,
                                time.perf_counter(),
                                kind="PRODUCER",
                                **{"messaging.destination.name": prediction_log.topic},
                            )
                    answering_at = time.perf_counter()
                    answer = prediction_to_proto(record)
                    if trace is not None:
                        trace.stage("respond", answering_at, time.perf_counter())
                    return answer
                except ScoringError as err:
                    code = getattr(grpc.StatusCode, err.grpc_code)
                    if code == grpc.StatusCode.INTERNAL:
                        log.exception("request %s failed", message.request_id or "-")
                    await context.abort(code, str(err))
                except Exception:
                    code = grpc.StatusCode.INTERNAL
                    log.exception("request %s failed", message.request_id or "-")
                    await context.abort(code, "internal error")
                finally:
                    scorer.metrics.requests.labels(DOOR, code.name).inc()
                    ms = (time.perf_counter() - began) * 1000
                    log.info("request %s %.2f ms %s%s", message.request_id or "-", ms, code.name, log_suffix(trace))
                    if trace is not None:
                        tracer.finish(
                            trace,
                            f"{SERVICE}/Score",
                            "SERVER",
                            time.perf_counter(),
                            error=None if code == grpc.StatusCode.OK else code.name,
                            **{
                                "loopline.request_id": message.request_id,
                                "rpc.system": "grpc",
                                "rpc.grpc.status_code": code.value[0],
                            },
                        )

        return Servicer()


async def _report_health(scorer: Scorer, servicer) -> None:
    """NOT_SERVING until a prod model is warm, then SERVING (for the whole server and the Scorer service)."""
    for service in ("", SERVICE):
        await servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    await scorer.wait_ready()
    for service in ("", SERVICE):
        await servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
