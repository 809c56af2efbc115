"""The HTTP/gRPC prediction log loses nothing silently: ack mode answers only once Kafka has the record,
a full queue pushes back (503) instead of dropping, and SIGTERM delivers what is queued.

Real Kafka: paused with SIGSTOP to play a broker that does not answer, then resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client import Counter as MetricCounter

from infra.service import free_port, wait_until
from infra.stack import LocalStack
from loopline.job_processes import start_scorer
from loopline.serving import build_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from online.errors import Overloaded
from online.prediction_log import PredictionLog
from schemas.records import PredictionRecord
from schemas.topics import PREDICTIONS
from tests.support.kafka_log import LogReader
from tests.support.scoring import score_request, serving_doors


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inputs = ["user_transaction_features:txn_count_5m", "request:amount"]
    return write_linear_model(tmp_path_factory.mktemp("model") / "m.onnx", inputs, np.array([0.1, 0.01]), -1.0)


@contextmanager
def broker_paused(stack: LocalStack) -> Iterator[None]:
    """The broker stopped (SIGSTOP: connections open, nothing answered) for the block, then resumed."""
    pid = stack.kafka.nodes[0].pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _logged(reader: LogReader, ids: set[str]) -> Counter:
    return Counter(r.request_id for r in reader.records(PredictionRecord) if r.request_id in ids)


def test_ack_mode_answers_only_once_kafka_has_the_record(applied: Settings, stack: LocalStack, model_path: Path) -> None:
    log = LogReader(applied.kafka.bootstrap, PREDICTIONS.name)
    answers = {}
    try:
        for mode in ("ack", "async"):
            serving = applied.serving.model_copy(update={"prediction_log": mode, "prediction_log_ack_timeout_s": 1.0})
            settings = applied.model_copy(update={"serving": serving})
            with serving_doors(settings, build_scorer(settings, model_path)) as (url, _):
                healthy = requests.post(f"{url}/v1/score", json=score_request("log-user", 1.0), timeout=10)
                assert healthy.status_code == 200
                assert wait_until(lambda healthy=healthy: _logged(log, {healthy.json()["request_id"]}), 30, 0.1)
                body = score_request("log-user", 2.0)
                with broker_paused(stack):
                    began = time.monotonic()
                    answers[mode] = requests.post(f"{url}/v1/score", json=body, timeout=10), time.monotonic() - began
                # Either way the record reaches the log once the broker is back (a refused request's too: at least once).
                assert wait_until(lambda body=body: _logged(log, {body["request_id"]}), 30, 0.1), mode
    finally:
        log.close()
    ack, took_s = answers["ack"]
    assert ack.status_code == 503 and ack.json()["error"] == "prediction log unavailable", ack.text
    assert 1.0 <= took_s < 3.0, "the client learns within the ack timeout that its score was not logged"
    assert answers["async"][0].status_code == 200, "async mode answers without waiting for Kafka"


def test_a_full_queue_pushes_back_instead_of_dropping(applied: Settings, stack: LocalStack) -> None:
    failures = MetricCounter("test_prediction_log_failures", "unused", registry=None)
    log = PredictionLog(
        bootstrap_servers=applied.kafka.bootstrap, topic=PREDICTIONS.name, failures=failures, mode="async", max_queued=10
    )
    record = PredictionRecord(
        schema_version=1,
        request_id="queue-0",
        entity_keys={"user_id": "u"},
        features={},
        model_name="m",
        model_version="1",
        score=0.5,
        requested_at_ms=1,
        scored_at_ms=1,
    )

    async def append_until_refused() -> int:
        for n in range(100):
            try:
                await log.append(record.model_copy(update={"request_id": f"queue-{n}"}))
            except Overloaded:
                return n
        return 100

    with broker_paused(stack):
        accepted = asyncio.run(append_until_refused())
    assert accepted == 10, "records beyond the queue are refused (503), not dropped"
    assert log.close(30) == 0, "what was queued is delivered once the broker is back"


def test_sigterm_delivers_every_queued_prediction(applied: Settings, model_path: Path, tmp_path: Path) -> None:
    port = free_port()
    server = start_scorer(
        applied,
        ["--http"],
        tmp_path / "serve.log",
        LOOPLINE_SERVING__HTTP_PORT=str(port),
        LOOPLINE_SERVING__PREDICTION_LOG="async",
        LOOPLINE_SERVING__MODEL_PATH=str(model_path),
    )
    url = f"http://127.0.0.1:{port}"
    log = LogReader(applied.kafka.bootstrap, PREDICTIONS.name)
    try:
        assert wait_until(lambda: _ready(url), 60, 0.1), "the scorer did not start"
        session = requests.Session()
        ids = set()
        for n in range(300):
            body = score_request("flush-user", float(n))
            assert session.post(f"{url}/v1/score", data=json.dumps(body), timeout=10).status_code == 200
            ids.add(body["request_id"])
        server.send_signal(signal.SIGTERM)  # at once: records may still be queued in the producer
        assert server.wait(30) == 0
        assert wait_until(lambda: len(_logged(log, ids)) == len(ids), 30, 0.1), f"{len(_logged(log, ids))} of {len(ids)} logged"
    finally:
        log.close()
        if server.poll() is None:
            server.kill()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/v1/models/ready", timeout=1).ok
    except requests.ConnectionError:
        return False
