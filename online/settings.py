"""The scorer's settings models (``serving``, with its request limits, tracing and LLM); ``loopline/settings.py``
composes and reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class TracingSettings(BaseModel):
    """Request traces of the scorer (OpenTelemetry: ``online/tracing.py``)."""

    enabled: bool = Field(default=True, description="Off: no trace id, no span, nothing exported.")
    otlp_endpoint: str | None = Field(default=None, description="An OTLP/HTTP traces URL; default the local stack's Jaeger.")
    sample_ratio: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="The share of requests traced without a sampled "
        "caller (chosen by trace id); failed and slow requests are traced anyway.",
    )
    slow_ms: float = Field(
        default=50.0,
        gt=0,
        description="A request slower than this (the scorer's latency objective) is traced whatever the ratio.",
    )
    max_tail_per_s: float = Field(
        default=20.0,
        ge=0,
        description="At most this many failed or slow requests a second are traced beyond the sampled ones (per "
        "worker): an overloaded scorer's every request is slow or refused, and tracing each would cost the CPU it lacks.",
    )
    service_name: str = Field(default="loopline-scorer", description="The scorer's service.name in its traces.")


class LlmSettings(BaseModel):
    """An LLM served by vLLM (its OpenAI-compatible server, started by infra/vllm/serve.sh)."""

    base_url: str = Field(default="http://127.0.0.1:8000/v1", description="The vLLM server's OpenAI API.")
    served_model: str = Field(description="The model name the server serves (its --served-model-name).")
    inputs: list[str] = Field(min_length=1, description="Features ('view:feature') and request fields ('request:x').")
    prompt: str = Field(description="str.format template over the inputs by position: '{0}', '{1:.2f}', ...")
    answers: list[str] = Field(default=["yes", "no"], min_length=2, max_length=2, description="Score = P(first) / P(either).")
    max_concurrency: int = Field(default=32, ge=1, description="Completions in flight at once.")
    timeout_ms: float = Field(default=1000.0, gt=0, description="Longest a completion may take; then 'overloaded'.")


class RequestLimitSettings(BaseModel):
    """How large a score request may be, on every door."""

    max_body_bytes: int = Field(default=65_536, ge=256, description="Larger: HTTP 413, gRPC RESOURCE_EXHAUSTED, a dead letter.")
    max_entity_keys: int = Field(default=8, ge=1)
    max_request_fields: int = Field(default=64, ge=0)
    max_key_length: int = Field(default=256, ge=1, description="Request id, entity keys, field names and string values.")
    max_json_depth: int = Field(default=32, ge=2)
    max_ahead_s: float = Field(
        default=5.0,
        ge=0,
        description="A request stamped (requested_at_ms) further ahead of the scorer's clock is refused "
        "(HTTP 422, gRPC INVALID_ARGUMENT, a dead letter): its windows would be read as of a time no event has reached yet. "
        "Raise it to score what-if requests at later times.",
    )


class ServingSettings(BaseModel):
    """The online scorer (`loopline serve`)."""

    host: str = Field(default="127.0.0.1", description="Where the HTTP and gRPC doors listen.")
    http_port: int = Field(default=8080, ge=1, le=65535)
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    model_name: str = Field(
        default="model", description="The registered model to serve (its prod and canary aliases); default: the project's model."
    )
    model_path: Path | None = Field(default=None, description="Serve this ONNX file instead of the model registry's versions.")
    model_version: str = Field(default="file", description="The version a model_path file is reported as.")
    model_registry_poll_s: float = Field(
        default=5.0, gt=0, description="How often the scorer checks the model registry's aliases."
    )
    llm: LlmSettings | None = Field(default=None, description="Serve this LLM (vLLM) instead of ONNX models.")
    stale_after_s: float = Field(
        default=5.0,
        gt=0,
        description="A feature view whose job has absorbed its events up to more than this before both "
        "a request's time and the clock is read as of that progress, and its features are named stale in the prediction "
        "record (loopline_scoring_stale_features): its windows hold no later event yet.",
    )
    feature_budget_ms: float = Field(
        default=20.0, gt=0, description="Feature fetch budget; then defaults (default: the project's serving budget)."
    )
    max_batch_size: int = Field(default=64, ge=1, description="Requests per model call (the dynamic batcher).")
    feature_batch_size: int = Field(default=64, ge=1, description="Entities per pipelined Redis read of concurrent requests.")
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    max_queue_size: int = Field(default=1024, ge=1)
    max_in_flight: int = Field(
        default=64,
        ge=1,
        description="Requests a worker's HTTP and gRPC doors score at once. Beyond, an HTTP request is refused with 503 and "
        "Retry-After, a gRPC one with RESOURCE_EXHAUSTED: an overloaded scorer says so rather than queue without bound and "
        "answer late on default features. The Kafka door, outside that bound, scores what it polled this many at a time "
        "and consumes no further until they are scored.",
    )
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    result_cache_ttl_s: float | None = Field(default=None, gt=0, description="Cache scores in Redis this long; off when unset.")
    prediction_log: Literal["ack", "async", "off"] = Field(
        default="ack",
        description="HTTP/gRPC predictions to scoring.predictions: ack (the response waits for Kafka), async, or off.",
    )
    prediction_log_ack_timeout_s: float = Field(default=5.0, gt=0, description="ack mode: longer is a 503 to retry.")
    limits: RequestLimitSettings = RequestLimitSettings()
    auth_token: SecretStr | None = Field(default=None, description="Bearer token for scoring and model status (HTTP, gRPC).")
    auth_token_file: Path | None = Field(default=None, description="Read the bearer token from this file instead.")
    stall_after_s: float = Field(default=60.0, gt=0, description="A door holding work this long without progress fails liveness.")
    shutdown_timeout_s: float = Field(default=30.0, gt=0, description="After SIGTERM, exit by force after this long.")
    kafka_broker_timeout_s: float = Field(default=10.0, gt=0, description="Timeout of each broker call of the Kafka door.")
    kafka_delivery: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once",
        description="The Kafka door: exactly_once (predictions and offsets committed together in a transaction every "
        "kafka_commit_interval_ms) or at_least_once (each prediction sent at once, offsets committed past acknowledged ones; a "
        "crash may score a request twice, and readers count it once by request id).",
    )
    kafka_commit_interval_ms: float = Field(
        default=50.0,
        gt=0,
        description="How often the Kafka door commits. exactly_once: "
        "a transaction commits this long after its first scored chunk was handed over (a request waits for it); "
        "at_least_once: offsets past acknowledged records (a crash scores again at most "
        "what was acknowledged since).",
    )
    kafka_group_id: str = "loopline-scorer"
    instance: str = Field(
        default="0",
        description="This member's name: its Kafka transactional id is <group>-<instance> "
        "(<group>-<instance>-<worker> for each of several workers).",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Scorer processes sharing the HTTP and gRPC ports (loopline "
        "serve --workers); default one per core this process may run on.",
    )
    tracing: TracingSettings = TracingSettings()
