"""What every fault drill promises, checked on its report."""

from __future__ import annotations

from collections.abc import Iterable

from loopline.scenarios.fault_drill import DrillReport

#: A test's drill: a second or two of steady load before each fault and a killed part down as long. What the tests count
#: (nothing lost or doubled, every part recovered) needs no more; ``benchmarks/faults.py`` keeps the drill's longer ones.
TRIMMED = {"steady_s": (1.0, 2.0), "down_s": (1.0, 2.0)}


def assert_the_drill_lost_nothing(report: DrillReport, kinds: Iterable[str]) -> None:
    """What every fault drill promises (``loopline/scenarios/fault_drill.py``): each fault of ``kinds`` injected and
    recovered from, every Kafka request with exactly one prediction, the features equal to the recompute, every
    process live."""
    assert sorted(f.kind for f in report.faults) == sorted(kinds)
    assert all(f.recovered_s is not None for f in report.faults), f"a part did not recover: {report.faults}"
    assert report.requests_sent > 1_000
    assert (report.requests_lost, report.requests_duplicated) == (0, 0), "every Kafka request has exactly one prediction"
    assert report.entities_compared > 500 and report.feature_mismatches == [], report.feature_mismatches[:5]
    assert report.not_live == [], "every process is up and live"
