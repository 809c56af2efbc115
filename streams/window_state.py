"""Per-entity sliding-window state, updated on every event (the Flink job's aggregation core).

Semantics, shared with the offline recompute (``streams/recompute.py``):

* An entity's features are evaluated at its latest event time ``T`` (the row's event time).
* A windowed aggregation with window ``W`` and slide ``S`` covers the entity's events whose
  slide bucket ``floor(ts / S)`` lies in ``(floor(T / S) - W/S, floor(T / S)]``: the last ``W``
  counted in steps of ``S``. The slide trades state size for how smoothly old events expire.
* Events up to the watermark bound out of order are absorbed wherever they fall; later ones
  are dead-lettered by the job and never reach this state.
* Sums are exact: amounts are added as integer millionths. ``time_since_previous`` is the
  seconds between ``T`` and the entity's latest earlier event time (by event time, not arrival).

Updating per event (rather than when a window closes) is what keeps features fresh: a new
event is reflected online as soon as its row is written, not a slide later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from streams.feature_plan import ViewPlan

#: Fixed-point scale for exact sums (micro-units of the currency).
SCALE = 1_000_000
#: Row versions are microseconds: event time in ms * 1000 plus the absorbed-event count mod 1000.
_COUNT_IN_VERSION = 1000


def quantize(value: float) -> int:
    """A number as integer millionths, the unit every sum is kept in."""
    return round(value * SCALE)


@dataclass
class _Bucket:
    count: int = 0
    total: int = 0
    maximum: float | None = None
    minimum: float | None = None
    distinct: set = field(default_factory=set)

    def add(self, value, numeric: bool, keep_distinct: bool) -> None:
        self.count += 1
        if numeric:
            self.total += quantize(value)
            self.maximum = value if self.maximum is None or value > self.maximum else self.maximum
            self.minimum = value if self.minimum is None or value < self.minimum else self.minimum
        if keep_distinct:
            self.distinct.add(value)


@dataclass
class EntityWindows:
    """All window state of one entity of one view. Picklable, so Flink can keep it in keyed state."""

    latest_ms: int | None = None
    previous_ms: int | None = None
    absorbed: int = 0
    #: slide_ms -> bucket index -> column -> bucket stats
    buckets: dict[int, dict[int, dict[str, _Bucket]]] = field(default_factory=dict)

    @property
    def version_us(self) -> int:
        """Row version: it grows with every absorbed event, whatever their arrival order.

        Both parts depend only on which events were absorbed (their newest time and their count),
        so a replay after a restart, which may interleave partitions differently, reproduces the
        same versions, and a row that includes more events is never taken for a duplicate. (It
        could repeat only if 1,000 events in a row arrived without any being the entity's newest.)
        """
        assert self.latest_ms is not None
        return self.latest_ms * 1000 + self.absorbed % _COUNT_IN_VERSION

    def absorb(self, plan: ViewPlan, event: dict) -> None:
        """Add one event (a decoded record as a dict) to the entity's windows."""
        ts = event["event_time_ms"]
        self.absorbed += 1
        if self.latest_ms is None or ts > self.latest_ms:
            self.previous_ms, self.latest_ms = self.latest_ms, ts
        elif ts < self.latest_ms and (self.previous_ms is None or ts > self.previous_ms):
            self.previous_ms = ts
        for slide_ms, columns in _columns_by_slide(plan).items():
            by_bucket = self.buckets.setdefault(slide_ms, {})
            stats = by_bucket.setdefault(ts // slide_ms, {})
            for column, (numeric, keep_distinct) in columns.items():
                stats.setdefault(column, _Bucket()).add(event[column], numeric, keep_distinct)
        self._expire(plan)

    def _expire(self, plan: ViewPlan) -> None:
        assert self.latest_ms is not None
        for slide_ms, span in _longest_span_by_slide(plan).items():
            oldest_kept = self.latest_ms // slide_ms - span + 1
            by_bucket = self.buckets.get(slide_ms, {})
            for index in [i for i in by_bucket if i < oldest_kept]:
                del by_bucket[index]

    def features(self, plan: ViewPlan) -> dict[str, float | int | None]:
        """Every feature of the view, evaluated at the entity's latest event time."""
        assert self.latest_ms is not None
        values: dict[str, float | int | None] = {}
        for agg in plan.aggregations:
            if agg.function == "time_since_previous":
                values[agg.name] = None if self.previous_ms is None else (self.latest_ms - self.previous_ms) / 1000
                continue
            current = self.latest_ms // agg.slide_ms
            stats = [
                columns[agg.column]
                for index, columns in self.buckets.get(agg.slide_ms, {}).items()
                if current - agg.window_buckets < index <= current and agg.column in columns
            ]
            values[agg.name] = _combine(agg.function, stats)
        return values


def _combine(function: str, stats: list[_Bucket]) -> float | int | None:
    count = sum(s.count for s in stats)
    if function == "count":
        return count
    if function == "count_distinct":
        return len(set().union(*(s.distinct for s in stats)))
    if count == 0:
        return None
    if function == "sum":
        return sum(s.total for s in stats) / SCALE
    if function == "mean":
        return sum(s.total for s in stats) / count / SCALE
    if function == "max":
        return max(s.maximum for s in stats if s.maximum is not None)
    return min(s.minimum for s in stats if s.minimum is not None)


@cache
def _columns_by_slide(plan: ViewPlan) -> dict[int, dict[str, tuple[bool, bool]]]:
    """slide_ms -> column -> (needs numeric stats, needs distinct values)."""
    result: dict[int, dict[str, tuple[bool, bool]]] = {}
    for agg in plan.aggregations:
        if agg.slide_ms is None:
            continue
        numeric, keep_distinct = result.setdefault(agg.slide_ms, {}).get(agg.column, (False, False))
        result[agg.slide_ms][agg.column] = (
            numeric or agg.function in ("sum", "mean", "max", "min"),
            keep_distinct or agg.function == "count_distinct",
        )
    return result


@cache
def _longest_span_by_slide(plan: ViewPlan) -> dict[int, int]:
    spans: dict[int, int] = {}
    for agg in plan.aggregations:
        if agg.slide_ms is not None:
            spans[agg.slide_ms] = max(spans.get(agg.slide_ms, 0), agg.window_buckets)
    return spans
