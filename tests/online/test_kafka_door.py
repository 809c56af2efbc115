"""The Kafka front door: one prediction record per request, exactly once, through a crash and through rebalances;
and at least once (``serving.kafka_delivery``): through a crash nothing lost, a few requests logged twice.

Real Kafka (transactions, read_committed), Redis and Feast; the scorer runs as `loopline serve
--kafka` in subprocesses: one killed with SIGKILL mid-stream and started again; two members of
one group, the second joining and the first leaving under load. (The monitor counts a request logged
twice once: tests/feedback_loop/test_monitor.py; the joiner joins it once: tests/feedback_loop/test_joiner_job.py.)
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from infra.service import wait_until
from loopline.job_processes import start_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from schemas.records import DeadLetterRecord, PredictionRecord, ScoreRequest
from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS
from schemas.validation import encode
from streams.producer import EventProducer
from streams.world import Emitted
from tests.support.kafka_log import LogReader, start_group_at_end
from tests.support.scoring import score_requests

INPUTS = ["user_transaction_features:txn_count_5m", "request:amount"]
WEIGHTS, BIAS = np.array([0.2, 0.01]), -1.5
REQUESTS = 20_000  # several seconds of scoring, so the kill lands mid-stream


def _serve(
    settings: Settings, model: Path, group: str, log: Path, instance: str = "0", delivery: str = "exactly_once", **env: str
) -> subprocess.Popen:
    return start_scorer(
        settings,
        ["--no-http", "--kafka", "--model", str(model)],
        log,
        LOOPLINE_SERVING__KAFKA_GROUP_ID=group,
        LOOPLINE_SERVING__INSTANCE=instance,
        LOOPLINE_SERVING__KAFKA_DELIVERY=delivery,
        **env,
    )


# Its waits add up to about 480 s: more than pytest's 300 s default, which would cut a slow but passing run.
@pytest.mark.timeout(600)
def test_each_request_is_scored_once_as_members_join_and_leave(applied: Settings, bootstrap: str, tmp_path: Path) -> None:
    model = write_linear_model(tmp_path / "model.onnx", INPUTS, WEIGHTS, BIAS)
    batch, rate = uuid.uuid4().hex[:8], 1_000
    # Requests keep coming until the members have changed: however long a member takes to start on a loaded machine.
    changed = threading.Event()
    stream = itertools.takewhile(
        lambda _: not changed.is_set(), score_requests([f"kafka-nobody-{i}" for i in range(50)], rate, batch)
    )
    sent: list[int] = []
    producing = threading.Thread(target=lambda: sent.append(EventProducer(bootstrap).publish(stream, rate_per_s=rate).total))
    # From the end: this test's predictions come only once its scorers start; earlier tests' need not be read.
    predictions = LogReader(bootstrap, PREDICTIONS.name, from_end=True)
    ours = lambda: [p for p in predictions.records(PredictionRecord) if p.request_id.startswith(batch)]  # noqa: E731
    group, logs = f"scorer-{batch}", {name: tmp_path / f"scorer-{name}.log" for name in "ab"}
    start_group_at_end(bootstrap, group, SCORE_REQUESTS.name)
    first = _serve(applied, model, group, logs["a"], instance="a")
    second = None
    producing.start()
    try:
        # The first member scoring (its log says so; its predictions become readable a transaction later) is enough.
        assert wait_until(lambda: b"request " in logs["a"].read_bytes() or first.poll() is not None, 120, 0.1), (
            "no request scored"
        )
        second = _serve(applied, model, group, logs["b"], instance="b")  # joins: partitions move under load
        assert wait_until(lambda: b"request " in logs["b"].read_bytes(), 120, 0.1), "the second member never scored"
        first.send_signal(signal.SIGTERM)  # leaves: its partitions move to the second member
        assert first.wait(30) == 0
        # The second member scores on, alone, before the requests stop.
        scored_by_b = logs["b"].read_bytes().count(b"request ")
        assert wait_until(lambda: logs["b"].read_bytes().count(b"request ") > scored_by_b + 100, 60, 0.1), (
            "the second member stopped"
        )
        changed.set()
        producing.join()
        assert wait_until(lambda: len(ours()) >= sent[0], 120, 0.2), f"only {len(ours())} of {sent[0]} predictions"
        time.sleep(1)  # let a stray duplicate, if the design allowed one, show up
        logged = ours()
    finally:
        changed.set()
        producing.join()
        for member in (first, second):
            if member is not None and member.poll() is None:
                member.send_signal(signal.SIGTERM)
                member.wait(10)
        predictions.close()
    counts = Counter(p.request_id for p in logged)
    assert len(counts) == sent[0] and max(counts.values()) == 1, "every request exactly once in the committed log"
    assert b"request " in logs["a"].read_bytes() and b"request " in logs["b"].read_bytes(), "both members scored"


def _requests(batch: str, count: int) -> list[ScoreRequest]:
    now = int(time.time() * 1000)
    return [
        ScoreRequest(
            schema_version=1,
            request_id=f"{batch}-{i}",
            entity_keys={"user_id": f"kafka-nobody-{i % 50}"},
            request_fields={"amount": float(i % 100)},
            requested_at_ms=now,
        )
        for i in range(count)
    ]


def _through_a_crash(
    applied: Settings, bootstrap: str, tmp_path: Path, delivery: str
) -> tuple[str, list[ScoreRequest], list[PredictionRecord], int]:
    """REQUESTS requests (and two bad ones) scored by a `loopline serve --kafka` in ``delivery`` mode that is killed
    with SIGKILL mid-stream and started again: (their batch id, the requests, every committed prediction of them,
    how many predictions were readable at the kill)."""
    model = write_linear_model(tmp_path / "model.onnx", INPUTS, WEIGHTS, BIAS)
    batch = uuid.uuid4().hex[:8]
    requests = _requests(batch, REQUESTS)
    now = requests[0].requested_at_ms
    emitted = [Emitted(SCORE_REQUESTS.name, r.request_id, encode(r), now, r) for r in requests]
    emitted.append(Emitted(SCORE_REQUESTS.name, f"{batch}-bad", b'{"schema_version": 1, "request_id": "x"}', now, None))
    no_amount = requests[0].model_copy(update={"request_id": f"{batch}-no-amount", "request_fields": {}})
    emitted.append(Emitted(SCORE_REQUESTS.name, no_amount.request_id, encode(no_amount), now, no_amount))
    group = f"scorer-{batch}"
    start_group_at_end(bootstrap, group, SCORE_REQUESTS.name)
    EventProducer(bootstrap).publish(emitted)

    # From the end: this batch's predictions only come once the scorer below starts, and reading every earlier test's
    # first would let a fast (at-least-once) scorer finish the batch before the kill.
    predictions = LogReader(bootstrap, PREDICTIONS.name, from_end=True)
    ours = lambda: [p for p in predictions.records(PredictionRecord) if p.request_id.startswith(batch)]  # noqa: E731
    scorer = _serve(applied, model, group, tmp_path / "scorer.log", delivery=delivery)
    try:
        assert wait_until(lambda: len(ours()) >= 1000 or scorer.poll() is not None, 120, 0.05), "no predictions logged"
    finally:
        scorer.send_signal(signal.SIGKILL)  # mid-stream, mid-transaction most likely
        scorer.wait(10)
    seen_at_kill = len(ours())
    assert seen_at_kill < REQUESTS, "the crash should happen before every request is scored"

    scorer = _serve(applied, model, group, tmp_path / "scorer.log", delivery=delivery)
    try:
        assert wait_until(lambda: len({p.request_id for p in ours()}) >= REQUESTS, 120, 0.2), (
            f"only {len(ours())} of {REQUESTS} predictions"
        )
        time.sleep(1)  # let a stray duplicate, if the design allowed one, show up
        logged = ours()
    finally:
        scorer.send_signal(signal.SIGTERM)
        scorer.wait(10)
    predictions.close()
    return batch, requests, logged, seen_at_kill


@pytest.mark.timeout(450)  # two scorer starts and about 300 s of waits (_through_a_crash's and the dead letters')
def test_each_request_is_scored_once_through_a_crash(applied: Settings, bootstrap: str, tmp_path: Path) -> None:
    batch, requests, logged, _ = _through_a_crash(applied, bootstrap, tmp_path, "exactly_once")
    counts = Counter(p.request_id for p in logged)
    assert len(counts) == REQUESTS and max(counts.values()) == 1, "every request exactly once in the committed log"
    by_id = {p.request_id: p for p in logged}
    for request in requests[:100]:
        record = by_id[request.request_id]
        assert record.defaulted_features == ["user_transaction_features:txn_count_5m"]
        expected = 1 / (1 + np.exp(-(np.float32(request.request_fields["amount"]) * np.float32(0.01) + np.float32(BIAS))))
        assert record.score == pytest.approx(float(expected), rel=1e-5)

    dead = LogReader(bootstrap, DEAD_LETTERS.name)

    def dead_lettered() -> set:
        letters = dead.records(DeadLetterRecord)
        return {(d.key, d.error_field) for d in letters if d.key.startswith(batch) and d.consumer == "loopline-scorer/kafka"}

    expected = {(f"{batch}-bad", "entity_keys"), (f"{batch}-no-amount", "request_fields.amount")}
    try:
        assert wait_until(lambda: dead_lettered() == expected, 30, 0.1), f"dead letters: {dead_lettered()}"
    finally:
        dead.close()


@pytest.mark.timeout(450)  # two scorer starts and about 270 s of waits
def test_at_least_once_loses_nothing_through_a_crash_and_scores_again_only_the_uncommitted(
    applied: Settings, bootstrap: str, tmp_path: Path
) -> None:
    _, requests, logged, seen_at_kill = _through_a_crash(applied, bootstrap, tmp_path, "at_least_once")
    counts = Counter(p.request_id for p in logged)
    assert set(counts) == {r.request_id for r in requests}, "every request has a prediction"
    twice = sum(n - 1 for n in counts.values())
    # Scored again: what was acknowledged in the last commit interval (50 ms) before the kill. A door that never
    # committed would score again all it had logged by then.
    assert twice < seen_at_kill / 2, f"{twice} duplicates of {seen_at_kill} logged at the kill"
    by_id = {p.request_id: p for p in logged}
    for request in requests[:100]:
        expected = 1 / (1 + np.exp(-(np.float32(request.request_fields["amount"]) * np.float32(0.01) + np.float32(BIAS))))
        assert by_id[request.request_id].score == pytest.approx(float(expected), rel=1e-5)


def test_at_least_once_waits_off_the_loop_for_room_in_a_full_producer_and_loses_nothing(
    applied: Settings, bootstrap: str, tmp_path: Path
) -> None:
    """A producer queue of three records (a broker slower than the door): most sends find no room, wait for the
    acknowledging thread to hand them over, and every request still has its one prediction."""
    model = write_linear_model(tmp_path / "model.onnx", INPUTS, WEIGHTS, BIAS)
    batch = uuid.uuid4().hex[:8]
    requests = _requests(batch, 3_000)
    predictions = LogReader(bootstrap, PREDICTIONS.name, from_end=True)
    start_group_at_end(bootstrap, f"scorer-{batch}", SCORE_REQUESTS.name)
    scorer = _serve(
        applied,
        model,
        f"scorer-{batch}",
        tmp_path / "scorer.log",
        delivery="at_least_once",
        LOOPLINE_KAFKA__CLIENT_CONFIG='{"queue.buffering.max.messages": "3"}',
    )
    try:
        EventProducer(bootstrap).publish(
            [Emitted(SCORE_REQUESTS.name, r.request_id, encode(r), r.requested_at_ms, r) for r in requests]
        )
        ours = lambda: [p.request_id for p in predictions.records(PredictionRecord) if p.request_id.startswith(batch)]  # noqa: E731
        assert wait_until(lambda: len(set(ours())) >= len(requests) or scorer.poll() is not None, 120, 0.2), (
            f"{len(ours())} logged"
        )
        time.sleep(1)  # a duplicate, if a send were repeated, would show now
        counts = Counter(ours())
    finally:
        scorer.send_signal(signal.SIGTERM)
        scorer.wait(10)
        predictions.close()
    assert set(counts) == {r.request_id for r in requests} and max(counts.values()) == 1, "each request once"
    assert "sending it again" not in (tmp_path / "scorer.log").read_text(), "no record was refused"
