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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

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

    def oldest_kept(self, at_ms: int) -> int:
        """The oldest tile a read at ``at_ms`` (or later) can still cover: older ones can be dropped."""
        return self.tile_of(at_ms) - self.kept + 1


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
    return window_values(tiles, shape, [aggregation], at_ms, latest_ms)[0]


def window_values(tiles: Mapping[int, Tile], shape: TileShape, aggregations: Sequence[AggregationSpec], at_ms: int, latest_ms: int) -> list:
    """:func:`window_value` of each of ``aggregations`` (all of ``shape``'s slide length); the tiles inside a window
    and their count are found once per window length."""
    head = shape.tile_of(max(at_ms, latest_ms))
    windows: dict[int, tuple[list[Tile], int]] = {}
    values = []
    for aggregation in aggregations:
        assert aggregation.window_ms is not None and aggregation.slide_ms == shape.slide_ms
        span = aggregation.window_buckets
        if span not in windows:
            inside = [tile for index, tile in tiles.items() if head - span < index <= head]
            windows[span] = inside, sum(tile.count for tile in inside)
        values.append(_aggregate(*windows[span], shape, aggregation))
    return values


def _aggregate(inside: list[Tile], count: int, shape: TileShape, aggregation: AggregationSpec):
    """``aggregation`` over the tiles ``inside`` its window, which hold ``count`` events."""
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


def encode_tile(index: int, tile: Tile) -> bytes:
    """Tile ``index`` as the online store keeps it (the job's ``TileBytes`` writes the same form): the text
    ``<index>:<count>:``, which orders a slot's versions without decoding the rest, then MessagePack
    ``[totals, maxima, minima, distinct]``."""
    import msgpack  # where tiles are stored or read: not the job's workers, whose environment lacks it (job_archives)

    body = [tile.totals, tile.maxima, tile.minima, [sorted(values, key=repr) for values in tile.distinct]]
    return b"%d:%d:" % (index, tile.count) + msgpack.packb(body)


def decode_tile(raw: bytes) -> tuple[int, Tile]:
    """The index and the tile :func:`encode_tile` (or the job) wrote."""
    import msgpack

    index, count, body = raw.split(b":", 2)
    totals, maxima, minima, distinct = msgpack.unpackb(body)
    return int(index), Tile(int(count), totals, maxima, minima, [set(values) for values in distinct])


def tile_head(raw: bytes) -> tuple[int, int]:
    """A stored tile's (index, count): how the store orders two versions of one slot."""
    index, count, _ = raw.split(b":", 2)
    return int(index), int(count)


def parse_marker(raw: bytes) -> tuple[int, dict[int, tuple[int, int]]]:
    """The job's marker beside an entity's finished values (``T,S1:k1:o1,...``): its latest event time ``T`` (ms),
    and per slide length ``S`` (ms) the size ``k`` of its ring of tile slots and the oldest tile with events it keeps."""
    latest, *slides = raw.split(b",")
    return int(latest), {int(slide): (int(kept), int(oldest)) for slide, kept, oldest in (part.split(b":") for part in slides)}


def split_tiles(framed: bytes) -> list[bytes]:
    """The tiles of one value the job frames several in (``TileBytes.frame``: each as ``<length>:`` then the tile)."""
    tiles, at = [], 0
    while at < len(framed):
        colon = framed.index(b":", at)
        end = colon + 1 + int(framed[at:colon])
        tiles.append(framed[colon + 1 : end])
        at = end
    return tiles


def millis(delta: timedelta | None) -> int | None:
    """A Feast window or slide in milliseconds (None stays None)."""
    return None if delta is None else int(delta.total_seconds() * 1000)


def view_aggregations(view) -> tuple[AggregationSpec, ...]:
    """The aggregations a Feast stream feature view declares, in its order, with windows and slides in ms (what
    ``streams/feature_plan.py`` compiles and checks; this side only reads them)."""
    return tuple(AggregationSpec(a.name, a.function, a.column, millis(a.time_window), millis(a.slide_interval))
                 for a in getattr(view, "aggregations", None) or ())  # fmt: skip
