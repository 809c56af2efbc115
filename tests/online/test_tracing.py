"""Request traces (``online/tracing.py``): every door's requests traced into the stack's real Jaeger, found through
Jaeger's query API with their stages; the caller's ``traceparent`` continued, the prediction record naming the trace;
what is kept and what is not (the caller's choice, failures, the share by trace id)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import requests
from confluent_kafka import Consumer, Producer
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from feature_store.online_write import FeatureRow, OnlineWriter
from infra.jaeger import trace_spans
from infra.service import wait_until
from loopline.serving import build_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from online.settings import TracingSettings
from online.tracing import RequestTracer, parse_traceparent
from schemas.grpc_api import scoring_api
from schemas.records import PredictionRecord, ScoreRequest
from schemas.topics import PREDICTIONS, SCORE_REQUESTS
from schemas.validation import decode, encode
from tests.support.scoring import score_request, serving_doors

VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", "request:amount"]
#: The stages under every scored request's span, by door (the Kafka door's record is logged by its transaction or
#: acknowledgement; it has no response to send).
SCORER_STAGES = {"receive", "feature_fetch", "redis round trip", "queue_wait", "inference", "log_prediction"}


def _traceparent(sampled: bool) -> tuple[str, str, str]:
    """(traceparent, its trace id, its span id) of a caller of our own."""
    trace_id, span_id = f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


@pytest.fixture(scope="module")
def traced(applied: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, str, str]]:
    """The scorer's doors (HTTP, gRPC, Kafka) tracing into the stack's Jaeger, with no share of its own (ratio 0) and
    a slow threshold no request reaches: only what the caller samples and what fails is kept."""
    model = write_linear_model(tmp_path_factory.mktemp("model") / "fraud.onnx", INPUTS, np.array([0.3, 0.004]), -2.0)
    OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path).write(
        [FeatureRow(VIEW, "trace-user", int(time.time() * 1_000_000), {"txn_count_5m": 3})]
    )
    tracing = TracingSettings(sample_ratio=0.0, slow_ms=60_000)
    settings = applied.model_copy(update={"serving": applied.serving.model_copy(update={"tracing": tracing})})
    with serving_doors(settings, build_scorer(settings, model), kafka=True) as (url, grpc_address):
        yield settings, url, grpc_address


def _spans_of(settings: Settings, trace_id: str, at_least: int) -> dict[str, dict]:
    """The trace's spans by operation, once Jaeger holds ``at_least`` of them."""
    found: list[dict] = []

    def arrived() -> bool:
        found[:] = trace_spans(settings.jaeger.query_url, trace_id)
        return len(found) >= at_least

    assert wait_until(arrived, 20, 0.2), (
        f"trace {trace_id} has {len(found)} spans in Jaeger: {[s['operationName'] for s in found]}"
    )
    return {span["operationName"]: span for span in found}


def _parent(span: dict) -> str | None:
    return next((ref["spanID"] for ref in span["references"] if ref["refType"] == "CHILD_OF"), None)


def _tags(span: dict) -> dict:
    return {tag["key"]: tag["value"] for tag in span["tags"]}


def _assert_stages(spans: dict[str, dict], root: str, caller_span: str, stages: set[str]) -> None:
    """``root`` is the request's span, a child of the caller's; each stage its child, the Redis round trip a part of the
    feature fetch, the stages inside the request's time."""
    assert set(spans) == {root, *stages}, sorted(spans)
    request = spans[root]
    assert _parent(request) == caller_span
    for stage in stages - {"redis round trip"}:
        assert _parent(spans[stage]) == request["spanID"], stage
        assert request["startTime"] <= spans[stage]["startTime"] <= request["startTime"] + request["duration"], stage
    assert _parent(spans["redis round trip"]) == spans["feature_fetch"]["spanID"]
    assert _tags(spans["inference"])["loopline.batch_size"] >= 1
    assert _tags(spans["redis round trip"])["loopline.entities_in_read"] >= 1


def test_a_sampled_http_request_is_traced_stage_by_stage_and_its_prediction_names_the_trace(traced) -> None:
    settings, url, _ = traced
    unsampled = requests.post(f"{url}/v1/score", json=score_request("trace-user", 10.0), timeout=10)
    header, trace_id, caller = _traceparent(sampled=True)
    request = score_request("trace-user", 12.0)
    answer = requests.post(f"{url}/v1/score", json=request, headers={"traceparent": header}, timeout=10)
    assert answer.status_code == 200 and answer.json()["trace_id"] == trace_id

    spans = _spans_of(settings, trace_id, len(SCORER_STAGES) + 2)
    _assert_stages(spans, "POST /v1/score", caller, SCORER_STAGES | {"respond"})
    assert _tags(spans["POST /v1/score"])["http.response.status_code"] == 200
    assert _tags(spans["POST /v1/score"])["loopline.request_id"] == request["request_id"]
    # The unsampled request went to the exporter first: had it been exported, Jaeger would have it by now.
    untraced = unsampled.json()["trace_id"]
    assert len(untraced) == 32 and untraced != trace_id and trace_spans(settings.jaeger.query_url, untraced) == []

    logged = _prediction_headers(settings, request["request_id"])
    assert logged == f"00-{trace_id}-{spans['POST /v1/score']['spanID']}-01"


def _prediction_headers(settings: Settings, request_id: str) -> str:
    """The ``traceparent`` header of the prediction record logged for ``request_id``."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([PREDICTIONS.name])
    found: list[str] = []

    def logged() -> bool:
        for message in consumer.consume(1000, 0.2):
            if message.error() is None and message.key() == request_id.encode():
                found.append(dict(message.headers() or [])["traceparent"].decode())
        return bool(found)

    try:
        assert wait_until(logged, 30, 0), f"no prediction logged for {request_id}"
    finally:
        consumer.close()
    return found[0]


def test_a_failed_request_is_kept_though_its_caller_did_not_sample_it(traced) -> None:
    settings, url, _ = traced
    header, trace_id, caller = _traceparent(sampled=False)
    bad = {**score_request("trace-user", 1.0), "request_fields": {"amount": "a lot"}}
    answer = requests.post(f"{url}/v1/score", json=bad, headers={"traceparent": header}, timeout=10)
    assert answer.status_code == 422
    spans = _spans_of(settings, trace_id, 3)
    assert set(spans) == {"POST /v1/score", "receive", "respond"}, "refused before its features were read"
    tags = _tags(spans["POST /v1/score"])
    assert (tags["http.response.status_code"], tags["error.type"], tags["otel.status_code"]) == (422, "422", "ERROR")
    assert _parent(spans["POST /v1/score"]) == caller


def test_grpc_and_kafka_requests_continue_their_callers_traces(traced) -> None:
    settings, _, grpc_address = traced
    messages, services = scoring_api()
    header, trace_id, caller = _traceparent(sampled=True)
    with grpc.insecure_channel(grpc_address) as channel:
        reply = services.ScorerStub(channel).Score(
            messages.ScoreRequest(
                request_id=str(uuid.uuid4()),
                entity_keys={"user_id": "trace-user"},
                request_fields={"amount": struct_pb2.Value(number_value=3.0)},
                requested_at_ms=int(time.time() * 1000),
            ),
            metadata=[("traceparent", header)],
            timeout=10,
        )
    assert reply.trace_id == trace_id
    spans = _spans_of(settings, trace_id, len(SCORER_STAGES) + 2)
    _assert_stages(spans, "loopline.scoring.v1.Scorer/Score", caller, SCORER_STAGES | {"respond"})

    header, trace_id, caller = _traceparent(sampled=True)
    request = score_request("trace-user", 4.0)
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap})
    producer.produce(
        SCORE_REQUESTS.name,
        encode(ScoreRequest.model_validate(request)),
        request["request_id"],
        headers=[("traceparent", header)],
    )
    assert producer.flush(10) == 0
    spans = _spans_of(settings, trace_id, len(SCORER_STAGES) + 1)
    _assert_stages(spans, f"score {SCORE_REQUESTS.name}", caller, SCORER_STAGES)
    assert _tags(spans["log_prediction"])["loopline.kafka_delivery"] == "exactly_once"
    logged = _prediction_headers(settings, request["request_id"])
    assert logged == f"00-{trace_id}-{spans[f'score {SCORE_REQUESTS.name}']['spanID']}-01"

    # Junk headers (bytes that are no text, a header with no value, repeats) are no traceparent: the request is scored,
    # in a trace of its own.
    request = score_request("trace-user", 5.0)
    junk = [("traceparent", b"\xff\xfe00-\x00"), ("traceparent", None), ("\u00e9\u00e9", b"\x80"), ("traceparent", b"")]
    producer.produce(SCORE_REQUESTS.name, encode(ScoreRequest.model_validate(request)), request["request_id"], headers=junk)
    assert producer.flush(10) == 0
    own = parse_traceparent(_prediction_headers(settings, request["request_id"]))
    assert own is not None and f"{own.trace_id:032x}" != trace_id


def test_the_share_kept_by_trace_id_is_the_ratio_and_a_caller_decides_for_its_own_requests() -> None:
    """The head decision alone, with nothing exported: (what ``begin`` says is sampled)."""
    tracer = RequestTracer("http://127.0.0.1:9/v1/traces", service="t", sample_ratio=0.1, slow_ms=50)
    try:
        kept = sum(tracer.begin(None, 0.0).sampled for _ in range(20_000))
        assert 1_700 <= kept <= 2_300, kept  # 2,000 expected; ~42 is one standard deviation
        header, trace_id, _ = _traceparent(sampled=False)
        assert not any(tracer.begin(header, 0.0).sampled for _ in range(100))
        assert tracer.begin(header, 0.0).trace_id_hex == trace_id
        assert tracer.begin(_traceparent(sampled=True)[0], 0.0).sampled
        never = RequestTracer("http://127.0.0.1:9/v1/traces", service="t", sample_ratio=0.0, slow_ms=50)
        assert not any(never.begin(None, 0.0).sampled for _ in range(1_000))
        never.close(0.1)
    finally:
        tracer.close(0.1)


def test_failed_and_slow_requests_are_traced_up_to_their_rate_and_sampled_ones_always() -> None:
    """Under overload every request is slow or refused: a burst of them keeps a second's worth of traces (the bucket
    is full at the start) and then about ``max_tail_per_s`` a second; a sampled request is kept whatever the bucket
    holds. (Nothing is exported here: the endpoint answers nobody.)"""
    tracer = RequestTracer("http://127.0.0.1:9/v1/traces", service="t", sample_ratio=0.0, slow_ms=50, max_tail_per_s=5)
    try:
        began = time.perf_counter()
        kept = sum(tracer.finish(tracer.begin(None, began), "r", "SERVER", began + 1.0) for _ in range(200))
        assert kept == 5, kept
        assert not tracer.finish(tracer.begin(None, began), "r", "SERVER", began + 0.001, error="503")
        assert tracer.finish(tracer.begin(_traceparent(sampled=True)[0], began), "r", "SERVER", began + 1.0)
        time.sleep(0.5)  # half a second refills half the rate
        refilled = sum(tracer.finish(tracer.begin(None, began), "r", "SERVER", began, error="503") for _ in range(20))
        assert 2 <= refilled <= 3, refilled  # 2.5 tokens, and what the calls before took
    finally:
        tracer.close(0.1)
    # Below one a second the bucket still holds one trace: the first failure is kept.
    rare = RequestTracer("http://127.0.0.1:9/v1/traces", service="t", sample_ratio=0.0, slow_ms=50, max_tail_per_s=0.5)
    try:
        kept = [rare.finish(rare.begin(None, began), "r", "SERVER", began, error="503") for _ in range(3)]
        assert kept == [True, False, False], kept
    finally:
        rare.close(0.1)


@given(st.text(max_size=80) | st.binary(max_size=80))
def test_any_traceparent_header_parses_or_is_ignored(value: str | bytes) -> None:
    parent = parse_traceparent(value)
    assert parent is None or (parent.trace_id and parent.span_id)


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
def test_a_well_formed_traceparent_gives_its_ids_back(trace_id: int, span_id: int, sampled: bool) -> None:
    parent = parse_traceparent(f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}")
    assert parent is not None and (parent.trace_id, parent.span_id, parent.sampled) == (trace_id, span_id, sampled)


@pytest.mark.parametrize(
    "value",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 has no more fields
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
    ],
)
def test_a_malformed_traceparent_starts_a_trace_of_its_own(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_s_traceparent_is_read_for_the_fields_it_shares() -> None:
    parent = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more")
    assert parent is not None and parent.span_id == 0x00F067AA0BA902B7 and parent.sampled


def test_decoded_records_still_read_without_a_trace_id() -> None:
    record = decode(
        PredictionRecord,
        b'{"schema_version":1,"request_id":"r","entity_keys":{"u":"1"},"features":{},'
        b'"model_name":"m","model_version":"1","score":0.5,"requested_at_ms":1,"scored_at_ms":2}',
    )
    assert record.trace_id is None
