"""Windows exact at request time: tiles of partial aggregates, merged by the job into steps a read picks from.

An aggregation of ``window_ms`` in slides of ``slide_ms`` keeps, per entity, one *tile* per slide that holds events
(tile ``k`` holds those with ``floor(event_time / slide) == k``): their count, and per aggregated column the exact
total (an integer of 1/:data:`SCALE`), the maximum and the minimum, or the distinct values (exact: each value is
counted in the newest tile it occurs in, so the job's state grows with the distinct values a window saw, and the
distinct count of any run of tiles is a sum).

The semantics every path shares (the stream job, the online read, the offline recompute, snapshots and the monitor).
A read at request time ``t`` of an entity whose latest absorbed event is at ``T`` covers the tiles ``k`` with
``floor(t' / slide) - window / slide < k <= floor(t' / slide)``, where ``t' = max(t, T)``:

* the tail is tile-aligned, as Chronon's "sawtooth": the oldest tile counts whole, so the window reaches back
  between ``window - slide`` and ``window`` before ``t``;
* the head is exact: when ``t >= T`` every absorbed event is at or before ``t``, and every one in the newest tiles
  counts (nothing is rounded at the head);
* the value depends on ``t``, not on when the entity's last event came: a quiet entity's windows empty tile by tile;
* a read earlier than the entity's latest event (``t < T``: a producer's clock ahead of the reader's, or a replay)
  reads as of ``T``, which is what the job's window says at that event.

At ``t = T`` this is the job's window (``streams/jvm`` ``WindowPlan``), so the finished values the job stores
beside the steps, which Feast's ``get_online_features`` returns, are these windows as of each entity's latest event.

Steps. No event lies after ``T``, so a read at ``t >= T`` covers a suffix of the tiles the window holds at ``T``,
and its value changes only when a tile with events leaves it. With the entity's online row the job stores, per
*window* (the aggregations of a view that share a slide and a window length), one value per tile ``k`` with events
inside the window at ``T``: the window over the tiles from ``k`` to the newest, valid while the read's head tile is
below ``k + window / slide``. A read takes the first step still valid (one binary search; past the last step the
window is empty), in the same round trip as the finished values: the merge of the tiles is done once per online
row, by the job, and never at read time. The stored form (little-endian): ``T`` (int64 ms), each step's bound
(int64 head tile, oldest step first), then each step's values in the window's order (int64 for counts, float64
otherwise). Steps of another ``T`` than the row's (written by another writer) are not read.

Empty windows: ``count`` and ``count_distinct`` are 0, the others None (the feature's declared default).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

#: Sums are kept exact, as integers of 1/SCALE (every path rounds a value to it half to even, as ``round`` does).
SCALE = 1_000_000
#: Functions computed from tiles.
TILED_FUNCTIONS = frozenset({"count", "sum", "mean", "max", "min", "count_distinct"})
#: Functions whose value is an integer (int64 in the steps), and 0 over an empty window.
COUNTING_FUNCTIONS = frozenset({"count", "count_distinct"})
_INT64 = struct.Struct("<q")
_LITTLE_ENDIAN = sys.byteorder == "little"


@dataclass(frozen=True)
class AggregationSpec:
    """One feature: ``function`` of ``column`` over the last ``window_ms``, in steps (tiles) of ``slide_ms``; both None
    for a feature without a window (``time_since_previous``). ``streams/feature_plan.py`` compiles them from Feast's
    stream feature views."""

    name: str
    function: str
    column: str
    window_ms: int | None
    slide_ms: int | None

    @property
    def window_buckets(self) -> int:
        """How many slides (tiles) the window spans."""
        assert self.window_ms is not None and self.slide_ms is not None
        return self.window_ms // self.slide_ms


class Window:
    """The aggregations of a view that share a slide and a window length, and the reading of their steps."""

    def __init__(self, slide_ms: int, window_ms: int, aggregations: tuple[AggregationSpec, ...]) -> None:
        self.slide_ms, self.window_ms, self.aggregations = slide_ms, window_ms, aggregations
        self._values = struct.Struct("<" + "".join("q" if a.function in COUNTING_FUNCTIONS else "d" for a in aggregations))
        self._step_size = 8 + self._values.size
        #: The values of the window once every tile has left it.
        self.empty = tuple(0 if a.function in COUNTING_FUNCTIONS else None for a in aggregations)

    @property
    def digest(self) -> str:
        """Names what the steps hold (each aggregation's name, function and column, in order): steps stored for other
        aggregations are never read as these."""
        text = ";".join(f"{a.name},{a.function},{a.column}" for a in self.aggregations)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def latest_ms(self, steps: bytes) -> int:
        """The entity's latest event time ``T`` the ``steps`` are as of."""
        return _INT64.unpack_from(steps)[0]

    def first_bound(self, steps: bytes) -> int:
        """The head tile from which the window's first step no longer holds: its oldest tile with events has left."""
        return _INT64.unpack_from(steps, 8)[0]

    def values_at(self, steps: bytes, at_ms: int) -> tuple:
        """The window's values read at ``at_ms`` (the module's semantics), from the ``steps`` the job stored."""
        count = (len(steps) - 8) // self._step_size
        head = at_ms // self.slide_ms
        if head < self.first_bound(steps):  # the usual read: no tile has left the window yet
            step = 0
        else:
            # The bounds read in place where the machine's own order is the stored one (most machines), else unpacked.
            bounds = memoryview(steps)[8 : 8 + 8 * count].cast("q") if _LITTLE_ENDIAN else _bounds(count).unpack_from(steps, 8)
            step = bisect_right(bounds, head)
            if step == count:
                return self.empty
        return self._values.unpack_from(steps, 8 + 8 * count + step * self._values.size)

    def encode(self, latest_ms: int, steps: Iterable[tuple[int, tuple]]) -> bytes:
        """The stored form of ``steps`` as of ``latest_ms``: ``(bound, values)`` pairs, oldest first (what the job's
        ``WindowPlan.steps`` writes; tests build steps from the window definition with it)."""
        steps = list(steps)
        return b"".join(
            [
                _INT64.pack(latest_ms),
                *(_INT64.pack(bound) for bound, _ in steps),
                *(self._values.pack(*values) for _, values in steps),
            ]
        )


@cache
def _bounds(count: int) -> struct.Struct:
    """The bounds of ``count`` steps (int64 each)."""
    return struct.Struct(f"<{count}q")


def view_windows(aggregations: Iterable[AggregationSpec]) -> dict[tuple[int, int], Window]:
    """The windows of ``aggregations`` by ``(slide_ms, window_ms)``, in order of first appearance (the order of the
    job's ``WindowPlan``); those without a window (``time_since_previous``) are passed over."""
    grouped: dict[tuple[int, int], list[AggregationSpec]] = {}
    for aggregation in aggregations:
        if aggregation.function in TILED_FUNCTIONS and aggregation.window_ms and aggregation.slide_ms:
            grouped.setdefault((aggregation.slide_ms, aggregation.window_ms), []).append(aggregation)
    return {key: Window(*key, tuple(members)) for key, members in grouped.items()}


def millis(delta: timedelta | None) -> int | None:
    """A Feast window or slide in milliseconds (None stays None)."""
    return None if delta is None else int(delta.total_seconds() * 1000)


def view_aggregations(view) -> tuple[AggregationSpec, ...]:
    """The aggregations a Feast stream feature view declares, in its order, with windows and slides in ms (what
    ``streams/feature_plan.py`` compiles and checks; this side only reads them)."""
    return tuple(
        AggregationSpec(a.name, a.function, a.column, millis(a.time_window), millis(a.slide_interval))
        for a in getattr(view, "aggregations", None) or ()
    )
