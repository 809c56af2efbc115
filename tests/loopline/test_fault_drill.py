"""Fault injection under load: kill -9 and restart the broker, Redis, the feature job and the Kafka-door
scorer in turn (``loopline/scenarios/fault_drill.py``), then count what was lost; and a scorer whose broker
freezes fails its liveness probe and still stops within its bound on SIGTERM.

The drill runs on a stack of its own (it kills its Kafka and Redis), real processes throughout. The
long version, with several faults of each kind, is ``benchmarks/faults.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from infra.service import wait_until
from infra.stack import LocalStack
from loopline.scenarios.fault_drill import FAULT_KINDS, FETCH_SLACK_MS, FaultDrill, job_restarts
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from schemas.topics import SCORE_REQUESTS
from streams.flink_job import RERUN_NOTE
from streams.producer import EventProducer
from streams.world import Emitted
from tests.support.drill import TRIMMED, assert_the_drill_lost_nothing
from tests.support.scoring import score_request, start_http_and_kafka_scorer
from tests.support.stack import private_stack, stack_settings

#: The integration tier: a stack of its own, whose parts the drill kills.
pytestmark = pytest.mark.stack


@pytest.mark.timeout(600)
def test_nothing_is_lost_or_doubled_when_parts_are_killed_under_load(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path / "stack")
    with private_stack(settings):
        report = FaultDrill(settings, tmp_path, faults_per_kind=1, on_progress=print, **TRIMMED).run()
    figures = report.figures()
    print(figures)
    assert_the_drill_lost_nothing(report, FAULT_KINDS)
    during = report.http_during_redis_outage()
    assert len(during) >= 10, "HTTP requests were sent while Redis was down"
    failed = [a for a in during if not a.on_defaults()]
    assert not failed, f"answered on defaults, none hung, while Redis was down: {failed}"
    # Reads fall back at the budget: the typical one ends within it (plus the event loop's turn); a starved turn on
    # the two shared cores may delay a few, and the figures report the slowest.
    assert figures["http_during_redis_outage_fetch_median_ms"] <= report.budget_s * 1000 + FETCH_SLACK_MS, figures


def test_sigterm_stops_the_scorer_within_its_bound_even_with_the_broker_frozen(
    applied: Settings, stack: LocalStack, tmp_path: Path
) -> None:
    model = write_linear_model(tmp_path / "m.onnx", ["request:amount"], np.array([0.01]), -1.0)
    log = tmp_path / "serve.log"
    server, url, _ = start_http_and_kafka_scorer(
        applied, model, log, "frozen", LOOPLINE_SERVING__STALL_AFTER_S="2", LOOPLINE_SERVING__SHUTDOWN_TIMEOUT_S="5"
    )
    try:
        assert wait_until(lambda: _status(f"{url}/v1/models/ready") == 200, 60, 0.1), "the scorer did not start"
        burst = [score_request(f"frozen-{n % 50}", 3.0) for n in range(20_000)]
        EventProducer(applied.kafka.bootstrap).publish(
            Emitted(SCORE_REQUESTS.name, r["request_id"], json.dumps(r).encode(), 0, None) for r in burst
        )
        # Mid-stream (the door always holds a batch then), the broker freezes: connections open, nothing answered.
        assert wait_until(lambda: log.read_bytes().count(b" ms ok") >= 1_000, 60, 0.1), "the scorer is not scoring"
        pid = stack.kafka.nodes[0].pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: _status(f"{url}/v1/health/live") == 503, 60, 0.2), "a stuck door fails liveness"
            began = time.monotonic()
            server.send_signal(signal.SIGTERM)
            code = server.wait(30)
            took_s = time.monotonic() - began
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        if server.poll() is None:
            server.kill()
    assert took_s < 10, f"SIGTERM took {took_s:.1f} s; the bound is serving.shutdown_timeout_s (5 s)"
    assert code in (0, 1), code


def test_job_restarts_are_counted_in_the_jobs_log_and_every_rolled_mini_cluster_log(tmp_path: Path) -> None:
    restarting = "Job features (abc) switched from state RUNNING to RESTARTING.\n"
    (tmp_path / "feature-job.log").write_text(f"starting\nthe job stalled; {RERUN_NOTE}\nfeatures written\n")
    flink = tmp_path / "feature-job-flink"
    flink.mkdir()
    (flink / "flink-minicluster.log").write_text(f"RUNNING\n{restarting}")
    (flink / "flink-minicluster.log.1").write_text(
        f"{restarting}{restarting}Job features switched from state CREATED to RUNNING.\n"
    )
    (tmp_path / "joiner.log").write_text(restarting)  # another job's: not counted for the feature job
    assert job_restarts(tmp_path, "feature-job") == 4
    assert job_restarts(tmp_path, "missing-job") == 0


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0
