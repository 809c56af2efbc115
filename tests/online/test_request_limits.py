"""Nothing a client sends stops a door: bad requests get clear answers on HTTP, gRPC and Kafka alike.

One `loopline serve --http --grpc --kafka` process (real Kafka, Redis, Feast, an ONNX model; once with one worker
and the exactly-once Kafka door, once with two workers and the at-least-once door) takes
hand-picked bad requests and Hypothesis-generated ones (structured requests with hostile values,
and raw bytes) through all three doors. Afterwards the process is alive, a valid request scores
through every door, every Kafka record got exactly one outcome (a prediction or a dead letter
with its reason), and SIGTERM stops the process cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from confluent_kafka import Producer
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from infra.service import free_port, wait_until
from loopline.job_processes import start_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from online.errors import InvalidRequest
from online.request_limits import RequestLimits, check_limits
from schemas.grpc_api import scoring_api
from schemas.records import DeadLetterRecord, PredictionRecord, ScoreRequest
from schemas.topics import DAY_MS, DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS
from tests.support.kafka_log import LogReader, start_group_at_end
from tests.support.scoring import score_request

INPUTS = ["user_transaction_features:txn_count_5m", "request:amount"]
HTTP_ANSWERS = {200, 404, 413, 422}
GRPC_ANSWERS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@dataclass
class Served:
    """A scorer process and where to reach it."""

    process: subprocess.Popen
    url: str
    grpc_address: str
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None


#: The scorer's shapes: the default one, and two workers behind the ports with the at-least-once Kafka door (no crash
#: here, so each record still has exactly one outcome).
SHAPES = {"one-worker-exactly-once": ("1", "exactly_once"), "two-workers-at-least-once": ("2", "at_least_once")}


@pytest.fixture(scope="module", params=list(SHAPES))
def served(applied: Settings, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Served]:
    workers, delivery = SHAPES[request.param]
    folder = tmp_path_factory.mktemp("bad-input")
    model = write_linear_model(folder / "model.onnx", INPUTS, np.array([0.2, 0.01]), -1.5)
    group = f"bad-input-{uuid.uuid4().hex[:8]}"
    start_group_at_end(applied.kafka.bootstrap, group, SCORE_REQUESTS.name)
    http_port, grpc_port = free_port(), free_port()
    log = folder / "serve.log"
    process = start_scorer(
        applied,
        ["--http", "--grpc", "--kafka", "--model", str(model)],
        log,
        LOOPLINE_SERVING__KAFKA_GROUP_ID=group,
        LOOPLINE_SERVING__HTTP_PORT=str(http_port),
        LOOPLINE_SERVING__GRPC_PORT=str(grpc_port),
        LOOPLINE_SERVING__INSTANCE=group,
        LOOPLINE_SERVING__WORKERS=workers,
        LOOPLINE_SERVING__KAFKA_DELIVERY=delivery,
    )
    served = Served(process, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", log)

    def ready() -> bool:
        try:
            return requests.get(f"{served.url}/v1/models/ready", timeout=1).ok
        except requests.ConnectionError:
            return served.alive() and False

    try:
        assert wait_until(ready, 60, 0.1), f"the scorer did not become ready; see {log}"
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, "SIGTERM stops the scorer cleanly"
    # A worker of two that died would be started again behind the supervisor, unseen by the requests.
    assert "starting it again" not in log.read_text(), f"a worker died; see {log}"


def _post(served: Served, body: bytes) -> requests.Response:
    return requests.post(f"{served.url}/v1/score", data=body, headers={"content-type": "application/json"}, timeout=10)


def _grpc(
    served: Served,
    request_id: str,
    entity_keys: dict,
    fields: dict[str, struct_pb2.Value],
    model_name: str = "",
    requested_at_ms: int = 1,
):
    """(status code, details) of a gRPC Score call."""
    messages, services = scoring_api()
    with grpc.insecure_channel(served.grpc_address) as channel:
        try:
            services.ScorerStub(channel).Score(
                messages.ScoreRequest(
                    request_id=request_id,
                    entity_keys=entity_keys,
                    request_fields=fields,
                    requested_at_ms=requested_at_ms,
                    model_name=model_name,
                ),
                timeout=10,
            )
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            return err.code(), err.details()


def _json(amount_literal: str, **changes) -> bytes:
    """A valid request's JSON with the amount written as ``amount_literal`` (so NaN and huge numbers go as sent)."""
    data = {**score_request("bad-input-user", 1.0), **changes}
    data["request_fields"] = {"amount": "AMOUNT"}
    return json.dumps(data).replace('"AMOUNT"', amount_literal).encode()


#: (what, request JSON, HTTP status, field the answer names)
BAD_REQUESTS = [
    ("a string amount", _json('"abc"'), 422, "request_fields.amount"),
    ("a boolean amount", _json("true"), 422, "request_fields.amount"),
    ("NaN", _json("NaN"), 422, "request_fields.amount"),
    ("Infinity", _json("-Infinity"), 422, "request_fields.amount"),
    ("an overflowing float", _json("1e400"), 422, "request_fields.amount"),
    ("an integer beyond a double", _json("1" + "0" * 400), 422, "request_fields.amount"),
    ("beyond 32-bit floats", _json("1e39"), 422, "request_fields.amount"),
    ("a list amount", _json("[1, 2]"), 422, "request_fields.amount"),
    (
        "no amount",
        json.dumps({**score_request("bad-input-user", 1.0), "request_fields": {}}).encode(),
        422,
        "request_fields.amount",
    ),
    ("not JSON", b"{this is not json", 422, "<payload>"),
    ("deep nesting", _json("[" * 5_000 + "]" * 5_000), 422, "<payload>"),
    ("too many entity keys", _json("1", entity_keys={f"k{i}": "v" for i in range(20)}), 422, "entity_keys"),
    ("a huge key", _json("1", entity_keys={"user_id": "u" * 1_000}), 422, "entity_keys.user_id"),
    ("an unknown model", _json("1", model_name="not-served"), 404, "model_name"),
    ("a body over 64 KiB", _json("1", request_id="r" * 70_000), 413, None),
    ("stamped a day ahead", _json("1", requested_at_ms=int(time.time() * 1000) + DAY_MS), 422, "requested_at_ms"),
    ("a 400-digit timestamp", _json("1", requested_at_ms="STAMP").replace(b'"STAMP"', b"9" * 400), 422, "requested_at_ms"),
]


def test_a_request_stamped_ahead_is_refused_beyond_the_bound_only() -> None:
    limits, now_ms = RequestLimits(max_ahead_s=5.0), int(time.time() * 1000)
    for ahead_ms, refused in ((-DAY_MS, False), (0, False), (4_000, False), (6_000, True), (10**400, True)):
        request = ScoreRequest.model_validate({**score_request("u", 1.0), "requested_at_ms": now_ms + ahead_ms})
        if refused:
            with pytest.raises(InvalidRequest, match=r"^requested_at_ms: .* ahead of the scorer's clock; at most 5 s$"):
                check_limits(request, limits)
        else:
            check_limits(request, limits)


def test_bad_requests_get_clear_answers_on_every_door(served: Served, applied: Settings) -> None:
    for what, body, status, field in BAD_REQUESTS:
        answer = _post(served, body)
        assert answer.status_code == status, f"{what}: {answer.status_code} {answer.text}"
        assert answer.json().get("field") == field, f"{what}: {answer.text}"
    assert served.alive()

    # The same mistakes over gRPC: the status code names the class, the details name the field.
    number, text = struct_pb2.Value(number_value=float("nan")), struct_pb2.Value(string_value="abc")
    listed = struct_pb2.Value(list_value=struct_pb2.ListValue(values=[number]))
    for value in (number, text, listed, struct_pb2.Value(number_value=1e39), struct_pb2.Value(bool_value=True)):
        code, details = _grpc(served, "g-1", {"user_id": "u"}, {"amount": value})
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request_fields.amount"), (value, code, details)
    assert (
        _grpc(served, "g-2", {"user_id": "u"}, {"amount": struct_pb2.Value(number_value=1)}, "not-served")[0]
        == grpc.StatusCode.NOT_FOUND
    )
    assert _grpc(served, "g-3", {"user_id": "u" * 70_000}, {})[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    ahead = _grpc(
        served,
        "g-4",
        {"user_id": "u"},
        {"amount": struct_pb2.Value(number_value=1)},
        requested_at_ms=int(time.time() * 1000) + DAY_MS,
    )
    assert ahead[0] == grpc.StatusCode.INVALID_ARGUMENT and ahead[1].startswith("requested_at_ms"), ahead

    # And over Kafka: each one is dead-lettered with its reason and field, and the door goes on.
    dead = LogReader(applied.kafka.bootstrap, DEAD_LETTERS.name)
    sent = _publish(applied, [body for _, body, _, _ in BAD_REQUESTS])
    try:

        def letters() -> dict[tuple[int, int], DeadLetterRecord]:
            records = dead.records(DeadLetterRecord)
            return {(r.source_partition, r.source_offset): r for r in records if (r.source_partition, r.source_offset) in sent}

        assert wait_until(lambda: len(letters()) == len(sent), 60, 0.1), f"{len(letters())} of {len(sent)} dead-lettered"
        reasons = {400: "invalid", 404: "unknown_model", 413: "too_large", 422: "invalid"}
        for (what, _, status, field), position in zip(BAD_REQUESTS, sent, strict=True):
            letter = letters()[position]
            assert (letter.reason, letter.error_field) == (reasons[status], field), what
    finally:
        dead.close()
    _assert_scores_on_every_door(served, applied)


def _publish(settings: Settings, payloads: list[bytes]) -> list[tuple[int, int]]:
    """Publish raw ``payloads`` to scoring.requests; their (partition, offset) in order."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap, "enable.idempotence": True})
    positions: dict[int, tuple[int, int]] = {}
    for index, payload in enumerate(payloads):
        producer.produce(
            SCORE_REQUESTS.name,
            payload,
            f"fuzz-{index}",
            on_delivery=lambda err, msg, i=index: positions.__setitem__(i, (msg.partition(), msg.offset())),
        )
    assert producer.flush(30) == 0
    return [positions[i] for i in range(len(payloads))]


def _assert_scores_on_every_door(served: Served, settings: Settings) -> None:
    """The process is alive and a valid request scores through HTTP, gRPC and Kafka."""
    assert served.alive(), f"the scorer died; see {served.log}"
    assert _post(served, json.dumps(score_request("bad-input-user", 5.0)).encode()).status_code == 200
    assert _grpc(served, "ok-1", {"user_id": "u"}, {"amount": struct_pb2.Value(number_value=5)})[0] == grpc.StatusCode.OK
    good = score_request("bad-input-user", 6.0)
    predictions = LogReader(settings.kafka.bootstrap, PREDICTIONS.name)
    try:
        _publish(settings, [json.dumps(good).encode()])
        found = lambda: any(r.request_id == good["request_id"] for r in predictions.records(PredictionRecord))  # noqa: E731
        assert wait_until(found, 60, 0.1), "a valid request still scores over Kafka"
    finally:
        predictions.close()


_text = st.text(max_size=12)
#: Stamped within the last day: requests the scorer takes (most of those further ahead are refused before scoring).
_recent_ms = st.integers(min_value=int(time.time() * 1000) - DAY_MS, max_value=int(time.time() * 1000))
_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    _text,
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(_text, st.integers(), max_size=2),
)
_structured = st.fixed_dictionaries(
    {
        "schema_version": st.sampled_from([1, 1, 1, 2, "1"]),
        "entity_keys": st.dictionaries(_text, st.one_of(_text, st.integers()), max_size=10),
        "request_fields": st.dictionaries(st.sampled_from(["amount", "other", ""]), _value, max_size=3),
        "requested_at_ms": st.one_of(_recent_ms, _recent_ms, st.integers(min_value=-5, max_value=2**70), _text),
    },
    optional={"model_name": st.one_of(st.none(), _text, st.just("fraud")), "extra": _value},
)


def test_fuzzed_requests_never_stop_a_door(served: Served, applied: Settings) -> None:
    run = uuid.uuid4().hex[:8]
    kafka_payloads: list[bytes] = []

    @hypothesis_settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(structured=_structured, raw=st.binary(max_size=200), as_raw=st.booleans())
    def one(structured: dict, raw: bytes, as_raw: bool) -> None:
        n = len(kafka_payloads)
        # Each door gets its own request id, so each door's outcomes can be told apart in the log.
        body = lambda door: raw if as_raw else json.dumps({**structured, "request_id": f"{run}-{n}-{door}"}, default=str).encode()  # noqa: E731
        kafka_payloads.append(body("kafka"))
        answer = _post(served, body("http"))
        assert answer.status_code in HTTP_ANSWERS, f"{body('http')[:200]!r}: {answer.status_code} {answer.text}"
        if not as_raw:
            fields = {name: _proto_value(value) for name, value in structured["request_fields"].items()}
            keys = {str(k): str(v) for k, v in structured["entity_keys"].items()}
            code, details = _grpc(served, f"{run}-{n}-grpc", keys, fields, str(structured.get("model_name") or ""))
            assert code in GRPC_ANSWERS, f"{structured}: {code} {details}"

    one()
    assert served.alive(), f"the scorer died; see {served.log}"

    predictions = LogReader(applied.kafka.bootstrap, PREDICTIONS.name)
    dead = LogReader(applied.kafka.bootstrap, DEAD_LETTERS.name)
    positions = _publish(applied, kafka_payloads)
    sent = set(positions)
    try:

        def outcomes() -> Counter:
            """Kafka's outcome for each fuzzed record: a prediction (by request id) or a dead letter (by position)."""
            records = predictions.records(PredictionRecord)
            scored = Counter(r.request_id for r in records if r.request_id.startswith(run) and r.request_id.endswith("-kafka"))
            letters = dead.records(DeadLetterRecord)
            return scored + Counter(
                (r.source_partition, r.source_offset) for r in letters if (r.source_partition, r.source_offset) in sent
            )

        assert wait_until(lambda: sum(outcomes().values()) >= len(sent), 90, 0.2), f"{sum(outcomes().values())} of {len(sent)}"
        assert sum(outcomes().values()) == len(sent) and max(outcomes().values()) == 1, "exactly one outcome per record"
    finally:
        predictions.close()
        dead.close()
    _assert_scores_on_every_door(served, applied)


def _proto_value(value) -> struct_pb2.Value:
    """``value`` as a protobuf Value, whatever it is (lists and dicts as Struct kinds, big ints as numbers)."""
    proto = struct_pb2.Value()
    if value is None:
        proto.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        proto.bool_value = value
    elif isinstance(value, (int, float)):
        proto.number_value = float(value) if abs(value) < 1e308 else float("inf")
    elif isinstance(value, str):
        proto.string_value = value
    elif isinstance(value, list):
        proto.list_value.values.extend(_proto_value(v) for v in value)
    else:
        proto.struct_value.update({str(k): float(v) if abs(v) < 1e308 else 0.0 for k, v in value.items()})
    return proto
