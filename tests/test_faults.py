"""Fault injection under load: kill -9 and restart the broker, Redis, the feature job and the Kafka-door
scorer in turn (``loopline/fault_drill.py``), then count what was lost.

A stack of its own (the drill kills its Kafka and Redis), real processes throughout. The long
version, with several faults of each kind, is ``benchmarks/faults.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import stack_settings
from feature_store.config import apply_definitions
from loopline.components import build_stack
from loopline.fault_drill import FAULT_KINDS, FaultDrill
from schemas.topics import TOPICS
from streams.topics import apply_topics


@pytest.mark.timeout(600)
def test_nothing_is_lost_or_doubled_when_parts_are_killed_under_load(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path / "stack")
    stack = build_stack(settings)
    stack.up()
    try:
        apply_topics(settings.kafka.bootstrap_servers, TOPICS)
        apply_definitions(settings.registry_path, settings.redis_connection)
        report = FaultDrill(settings, tmp_path, faults_per_kind=1, on_progress=print).run()
    finally:
        stack.down(wipe=True)
    figures = report.figures()
    print(figures)
    assert sorted(f.kind for f in report.faults) == sorted(FAULT_KINDS)
    assert all(f.recovered_s is not None for f in report.faults), f"a part did not recover: {report.faults}"
    assert report.requests_sent > 1_000
    assert (report.requests_lost, report.requests_duplicated) == (0, 0), "every Kafka request has exactly one prediction"
    assert report.entities_compared > 500 and report.feature_mismatches == [], report.feature_mismatches[:5]
    during = report.http_during_redis_outage()
    assert len(during) >= 10, "HTTP requests were sent while Redis was down"
    slow_or_failed = [a for a in during if not a.on_defaults_within(report.budget_s)]
    assert not slow_or_failed, f"answered within budget on defaults while Redis was down: {slow_or_failed}"
    assert report.not_live == [], "every process is up and live"
