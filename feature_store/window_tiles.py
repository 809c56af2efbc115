"""Windows exact at request time, from tiles: an entity's partial aggregates per slide of event time, merged at read.

An aggregation of ``window_ms`` in slides of ``slide_ms`` keeps, per entity, one *tile* per slide that holds events
(tile ``k`` holds those with ``floor(event_time / slide) == k``): their count, and per aggregated column the exact
total (an integer of 1/:data:`SCALE`), the maximum and the minimum, or the set of distinct values (exact sets: a
tile's memory grows with the distinct values it saw, which for the views here are merchants, users and countries).

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

At ``t = T`` this is the job's window (``streams/jvm`` ``SlidingWindows``), so the finished values the job stores
beside the tiles are these windows as of each entity's latest event.

Empty windows: ``count`` and ``count_distinct`` are 0, the others None (the feature's declared default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Sums are kept exact, as integers of 1/SCALE (every path rounds a value to it half to even, as ``round`` does).
SCALE = 1_000_000
#: Functions computed from tiles.
TILED_FUNCTIONS = frozenset({"count", "sum", "mean", "max", "min", "count_distinct"})
_NUMERIC = frozenset({"sum", "mean", "max", "min"})


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


@dataclass(frozen=True)
class TileShape:
    """The tiles of one slide length: which columns they aggregate, and how many of them any window reads."""

    slide_ms: int
    kept: int  # the most tiles a window of this slide spans
    numeric: tuple[str, ...]  # columns summed, averaged or taken the extremes of
    distinct: tuple[str, ...]  # columns whose distinct values are counted

    def tile_of(self, event_time_ms: int) -> int:
        """The index of the tile an event at ``event_time_ms`` belongs to."""
        return event_time_ms // self.slide_ms

    def oldest_kept(self, latest_ms: int) -> int:
        """The oldest tile a read at or after ``latest_ms`` can still cover: older ones can be dropped."""
        return self.tile_of(latest_ms) - self.kept + 1


@dataclass
class Tile:
    """One slide's partial aggregates: the event count, and per column of its shape the exact total, the extremes, or
    the distinct values."""

    count: int = 0
    totals: list[int] = field(default_factory=list)
    maxima: list[float] = field(default_factory=list)
    minima: list[float] = field(default_factory=list)
    distinct: list[set] = field(default_factory=list)


def tile_shapes(aggregations: Iterable[AggregationSpec]) -> dict[int, TileShape]:
    """The shape of each slide length's tiles for ``aggregations`` (those not in :data:`TILED_FUNCTIONS`, such as
    ``time_since_previous``, are passed over), by slide length."""
    by_slide: dict[int, tuple[int, list[str], list[str]]] = {}
    for aggregation in aggregations:
        if aggregation.function not in TILED_FUNCTIONS or not aggregation.window_ms or not aggregation.slide_ms:
            continue
        kept, numeric, distinct = by_slide.get(aggregation.slide_ms, (0, [], []))
        columns = distinct if aggregation.function == "count_distinct" else numeric if aggregation.function in _NUMERIC else []
        if aggregation.column not in columns and aggregation.function != "count":
            columns.append(aggregation.column)
        by_slide[aggregation.slide_ms] = (max(kept, aggregation.window_ms // aggregation.slide_ms), numeric, distinct)
    return {slide: TileShape(slide, kept, tuple(numeric), tuple(distinct)) for slide, (kept, numeric, distinct) in by_slide.items()}


def fold(tiles: dict[int, Tile], shape: TileShape, event: Mapping[str, object], event_time_ms: int) -> int:
    """Absorb ``event`` (its fields by column) into its tile of ``tiles``; the index of that tile."""
    index = shape.tile_of(event_time_ms)
    tile = tiles.get(index)
    if tile is None:
        tile = tiles[index] = Tile(0, [0] * len(shape.numeric), [float("-inf")] * len(shape.numeric),
                                   [float("inf")] * len(shape.numeric), [set() for _ in shape.distinct])  # fmt: skip
    tile.count += 1
    for slot, column in enumerate(shape.numeric):
        value = float(event[column])  # type: ignore[arg-type]
        tile.totals[slot] += round(value * SCALE)
        tile.maxima[slot] = max(tile.maxima[slot], value)
        tile.minima[slot] = min(tile.minima[slot], value)
    for slot, column in enumerate(shape.distinct):
        tile.distinct[slot].add(event[column])
    return index


def window_value(tiles: Mapping[int, Tile], shape: TileShape, aggregation: AggregationSpec, at_ms: int, latest_ms: int):
    """``aggregation`` over its window as read at ``at_ms`` of an entity whose latest event is at ``latest_ms`` (the
    module's semantics), from that entity's ``tiles`` of ``shape``."""
    assert aggregation.window_ms is not None and aggregation.slide_ms == shape.slide_ms
    head = shape.tile_of(max(at_ms, latest_ms))
    inside = [tile for index, tile in tiles.items() if head - aggregation.window_buckets < index <= head]
    count = sum(tile.count for tile in inside)
    function = aggregation.function
    if function == "count":
        return count
    if function == "count_distinct":
        slot = shape.distinct.index(aggregation.column)
        return len(set().union(*(tile.distinct[slot] for tile in inside)))
    if count == 0:
        return None
    slot = shape.numeric.index(aggregation.column)
    if function == "max":
        return max(tile.maxima[slot] for tile in inside)
    if function == "min":
        return min(tile.minima[slot] for tile in inside)
    total = sum(tile.totals[slot] for tile in inside)
    return total / SCALE if function == "sum" else total / count / SCALE


def encode(tiles: Mapping[int, Tile]) -> bytes:
    """``tiles`` (of one shape) as stored: a MessagePack array of ``[index, count, totals, maxima, minima, distinct]``
    per tile, oldest first."""
    import msgpack  # where tiles are stored or read: not the job's workers, whose environment lacks it (job_archives)

    return msgpack.packb([[index, tile.count, tile.totals, tile.maxima, tile.minima, [sorted(values, key=repr) for values in tile.distinct]]
                          for index, tile in sorted(tiles.items())])  # fmt: skip


def decode(raw: bytes) -> dict[int, Tile]:
    """The tiles :func:`encode` wrote, by index."""
    import msgpack

    return {index: Tile(count, totals, maxima, minima, [set(values) for values in distinct])
            for index, count, totals, maxima, minima, distinct in msgpack.unpackb(raw, strict_map_key=False)}  # fmt: skip
