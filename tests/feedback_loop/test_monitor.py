"""The skew monitor on the real stack: `loopline monitor` (faust-streaming, real Kafka) reads scoring.predictions,
measures each feature's skew against a snapshot's reference, exports it to Prometheus, and resumes its window from
its changelog after a SIGKILL, counting nothing twice. Records it cannot count (undecodable, or contract-valid but
odd: a string where a number goes, ±Infinity, an integer beyond a double, no features) are bad records by reason;
odd ones it can count (a boolean, a number beyond float32, NaN, an unknown feature, a version never seen) count.
A request logged twice (as an at-least-once scorer that crashed logs it) is counted once.

Predictions are produced transactionally, as the scorer's Kafka door writes them, under a model version of this
test's own (other tests write scoring.predictions too); one aborted transaction must never be counted.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from feedback_loop.monitor_metrics import BAD_RECORD_REASONS
from feedback_loop.snapshots import examples_frame, write_snapshot
from infra.service import free_port, wait_until
from loopline.job_processes import start_loopline, stop_process_group
from loopline.settings import Settings
from schemas.records import PredictionRecord, TrainingExample
from schemas.topics import PREDICTIONS
from schemas.validation import encode
from tests.support.kafka_log import JUNK_KEY, start_group_at_end

AMOUNT, COUNT, CHANNEL = "request:amount", "user_transaction_features:txn_count_1h", "request:channel"
BATCH = 250


def _values(rng: np.random.Generator, n: int, shift: float = 1.0) -> list[dict]:
    amounts, counts = rng.lognormal(3, 1, n) * shift, rng.poisson(4, n)
    channels = rng.choice(["web", "app", "pos"], n, p=[0.5, 0.3, 0.2])
    return [{AMOUNT: float(a), COUNT: int(c), CHANNEL: str(ch)} for a, c, ch in zip(amounts, counts, channels, strict=True)]


def _reference(settings: Settings) -> str:
    rng = np.random.default_rng(0)
    examples = [
        TrainingExample(
            schema_version=1,
            event_id=f"ref-{i}",
            request_id=f"ref-{i}",
            entity_keys={"user_id": f"u{i}"},
            features=features,
            model_name="fraud",
            model_version="1",
            score=0.5,
            label=float(i % 9 == 0),
            requested_at_ms=1_790_000_000_000 + i,
            predicted_at_ms=1_790_000_000_000 + i,
            label_time_ms=1_790_000_100_000,
            joined_at_ms=1_790_000_100_000,
        )
        for i, features in enumerate(_values(rng, 5_000))
    ]
    manifest = write_snapshot(
        examples_frame(examples),
        settings.snapshots_root,
        kind="feedback",
        source={"test": "monitor"},
        time_range={"from_ms": None, "to_ms": None},
    )
    return manifest.snapshot_id


def _prediction(version: str, features: dict, i: int) -> PredictionRecord:
    now = int(time.time() * 1000)
    return PredictionRecord(
        schema_version=1,
        request_id=f"{version}-{uuid.uuid4().hex[:10]}",
        entity_keys={"user_id": f"u{i % 500}"},
        features=features,
        model_name="fraud",
        model_version=version,
        score=0.5,
        requested_at_ms=now - 3,
        scored_at_ms=now,
    )


def _odd(version: str, odd_version: str, good: dict) -> list[tuple[bytes, str | None]]:
    """Contract-valid records a careless writer could log, as JSON Python writes it (NaN, Infinity, integers of any
    length), each with the bad-record reason it must get (None: counted, under ``odd_version``)."""
    cases = [
        ({**good, AMOUNT: "abc"}, version, "wrong_type"),
        ({**good, AMOUNT: 10**400}, version, "not_finite"),
        ({**good, AMOUNT: float("inf")}, version, "not_finite"),
        ({**good, COUNT: float("-inf")}, version, "not_finite"),
        ({}, version, "no_features"),
        ({**good, AMOUNT: True}, odd_version, None),
        ({**good, AMOUNT: 3 * 10**39}, odd_version, None),  # beyond float32
        ({**good, AMOUNT: float("nan")}, odd_version, None),
        ({**good, CHANNEL: 7}, odd_version, None),
        ({**good, "request:unknown": "abc"}, odd_version, None),
    ]
    return [
        (json.dumps(_prediction(v, features, i).model_dump()).encode(), reason) for i, (features, v, reason) in enumerate(cases)
    ]


def _produce(producer: Producer, version: str, values: list[dict], abort: bool = False) -> None:
    producer.begin_transaction()
    for i, features in enumerate(values):
        record = _prediction(version, features, i)
        producer.produce(PREDICTIONS.name, encode(record), record.request_id)
    # Delivered first: aborting with records still in flight made Kafka 4.4 answer INVALID_TXN_STATE (fatal) once in two runs.
    assert producer.flush(30) == 0
    producer.abort_transaction() if abort else producer.commit_transaction()


def _bad_records(url: str) -> dict[str, float]:
    """{reason: bad records} (empty while the monitor is not answering)."""
    try:
        text = requests.get(url, timeout=2).text
    except requests.ConnectionError:
        return {}
    return {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loopline_monitor_bad_records_total"
    }


def _duplicates(url: str) -> float | None:
    """Records of a request already counted (None while the monitor is not answering)."""
    try:
        text = requests.get(url, timeout=2).text
    except requests.ConnectionError:
        return None
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loopline_monitor_duplicate_records_total"
    )


def _metrics(url: str, version: str) -> dict[str, dict[str, float]]:
    """{metric name: {feature: value}} of this version's series (empty while the monitor is not answering)."""
    try:
        text = requests.get(url, timeout=2).text
    except requests.ConnectionError:
        return {}
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_version") == version:
                found.setdefault(sample.name, {})[sample.labels["feature"]] = sample.value
    return found


@pytest.fixture
def monitor(applied: Settings, tmp_path: Path):
    """Start `loopline monitor` (a fresh app whose consumer group starts at the topic's end: other tests' predictions
    are not this test's to wait for) against a reference snapshot; yields (its metrics URL, restart: kill -9 and start
    again, its log)."""
    port, app_id = free_port(), f"monitor-{uuid.uuid4().hex[:8]}"
    start_group_at_end(applied.kafka.bootstrap, app_id, PREDICTIONS.name)
    env = {
        "LOOPLINE_MONITOR__APP_ID": app_id,
        "LOOPLINE_MONITOR__METRICS_PORT": str(port),
        "LOOPLINE_MONITOR__MIN_ROWS": "500",
        "LOOPLINE_MONITOR__REFERENCE_SNAPSHOT": _reference(applied),
        "LOOPLINE_MONITOR__CHECK_INTERVAL_S": "0.5",
        "LOOPLINE_MONITOR__CONSISTENCY_INTERVAL_S": "3600",
    }
    log = tmp_path / "monitor.log"
    processes = [start_loopline(applied, ["monitor"], log, **env)]

    def restart() -> None:
        stop_process_group(processes[-1], signal.SIGKILL)
        processes.append(start_loopline(applied, ["monitor"], log, **env))

    try:
        yield f"http://127.0.0.1:{port}/metrics", restart, log
    finally:
        stop_process_group(processes[-1], signal.SIGTERM)


def test_a_shifted_feature_alerts_within_bounded_data_and_the_window_survives_a_kill(applied: Settings, monitor) -> None:
    url, restart, log = monitor
    version = f"mon-{uuid.uuid4().hex[:6]}"
    # lz4, as the scorer's prediction log compresses (faust's aiokafka needs the lz4 package to read it).
    producer = Producer(
        {"bootstrap.servers": applied.kafka.bootstrap, "transactional.id": f"test-{version}", "compression.type": "lz4"}
    )
    producer.init_transactions()
    rng = np.random.default_rng(1)

    def rows(of: str = version) -> float:
        return _metrics(url, of).get("loopline_feature_window_rows", {}).get(AMOUNT, 0)

    # A healthy stretch: 3,000 requests like the reference; an aborted transaction of shifted ones is never counted.
    for _ in range(12):
        _produce(producer, version, _values(rng, BATCH))
    _produce(producer, version, _values(rng, 2_000, shift=5.0), abort=True)
    # What a careless or hostile writer leaves on the topic, among 40 good records in one transaction: garbage bytes,
    # JSON of the wrong shape, a huge value, and records the contract takes but the window cannot count, or counts
    # only as what they are (under a version never seen, with the table key's separator in its name).
    odd_version = f"{version}|odd"
    junk = [
        (raw, "contract_violation")
        for raw in (b"\x00\xff\xfe garbage", b'{"schema_version": 1}', b"[" * 100_000, b'{"score": 1e999}')
    ]
    junk += _odd(version, odd_version, _values(rng, 1)[0])
    goods = [_prediction(version, features, i) for i, features in enumerate(_values(rng, 40))]
    producer.begin_transaction()
    for i, record in enumerate(goods):
        producer.produce(PREDICTIONS.name, encode(record), record.request_id)
        if i < len(junk):
            producer.produce(PREDICTIONS.name, junk[i][0], JUNK_KEY)
    # An at-least-once scorer that crashed logs some requests twice: a second record of the same request id, later.
    repeated = goods[:5]
    for record in repeated:
        producer.produce(
            PREDICTIONS.name, encode(record.model_copy(update={"scored_at_ms": record.scored_at_ms + 7})), record.request_id
        )
    assert producer.flush(30) == 0
    producer.commit_transaction()
    healthy_rows = 12 * BATCH + len(goods)
    want_bad = {reason: float(sum(r == reason for _, r in junk)) for reason in BAD_RECORD_REASONS}
    want_odd = float(sum(r is None for _, r in junk))

    def settled() -> bool:
        return (
            rows() == healthy_rows
            and rows(odd_version) == want_odd
            and _bad_records(url) == want_bad
            and _duplicates(url) == len(repeated)
        )

    assert wait_until(settled, 120, 0.2), (
        f"window rows {rows()}, odd {rows(odd_version)}, bad {_bad_records(url)}; "
        f"duplicates {_duplicates(url)}; log:\n{log.read_text()[-3000:]}"
    )
    # Nothing the agent met crashed it: faust would restart it, losing what of the batch it held, and log the crash.
    assert "Crashed" not in log.read_text() and "Traceback" not in log.read_text(), log.read_text()[-3000:]
    healthy = _metrics(url, version)
    assert max(healthy["loopline_feature_psi"].values()) < 0.1, healthy
    assert healthy["loopline_feature_linf_distance"][CHANNEL] < 0.05 and healthy["loopline_feature_js_divergence"][AMOUNT] < 0.02

    # Amounts arrive in cents (a currency bug upstream): PSI crosses 0.25 within a bounded share of the window's data
    # (tripled amounts took half the window, 3,000 requests, to reach 0.246); the other features stay quiet.
    sent = 0
    while sent < 3_000:
        _produce(producer, version, _values(rng, BATCH, shift=100.0))
        sent += BATCH
        assert wait_until(lambda sent=sent: rows() == healthy_rows + sent, 60, 0.2), rows()
        if _metrics(url, version)["loopline_feature_psi"][AMOUNT] >= 0.25:
            break
    shifted = _metrics(url, version)
    assert shifted["loopline_feature_psi"][AMOUNT] >= 0.25, f"no alert after {sent} shifted requests: {shifted}"
    # Every shifted value lands in the reference's top decile: PSI passes 0.25 once they are ~22 % of the window.
    assert sent <= 1_000, f"the alert took {sent} shifted requests"
    assert shifted["loopline_feature_psi"][COUNT] < 0.1 and shifted["loopline_feature_linf_distance"][CHANNEL] < 0.05

    # kill -9 while a batch is being counted (its transaction, or the one after, still open): the restarted monitor
    # recovers its window from the changelog, re-reads what was not committed, loses nothing and counts nothing twice.
    _produce(producer, version, _values(rng, BATCH))
    sent += BATCH
    assert wait_until(lambda: rows() > healthy_rows + sent - BATCH, 30, 0.01), "the monitor did not start counting the batch"
    restart()
    # While it recovers the table and re-reads what its last transaction had not committed, a check can publish a
    # partial count; it settles on the exact one (a monitor starting empty would never reach it, one counting twice
    # would pass it).
    assert wait_until(lambda: rows() == healthy_rows + sent, 120, 0.2), f"window rows {rows()}; log:\n{log.read_text()[-3000:]}"
    _produce(producer, version, _values(rng, BATCH))
    assert wait_until(lambda: rows() == healthy_rows + sent + BATCH, 60, 0.2), rows()
