"""Tiles merged at request time against a brute-force reading of the window definition, on small random histories.

The reference reads the definition event by event (``tests/window_definition.py``). The tiles are folded
in a shuffled arrival order and go through their stored form. At the entity's latest event the merge also equals the
offline recompute (``streams/recompute.py``, the job's semantics), and long after it every window is empty.
"""

from __future__ import annotations

import math

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from window_definition import window_by_definition

from feature_store.window_tiles import (
    SCALE,
    TILED_FUNCTIONS,
    AggregationSpec,
    Tile,
    decode_tile,
    encode_tile,
    fold,
    split_tiles,
    tile_shapes,
    window_value,
)
from streams.feature_plan import ViewPlan
from streams.recompute import EVENT_TIME, recompute

START = 1_790_000_000_000
AMOUNTS = st.one_of(
    st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
    st.integers(0, 10**8).map(lambda i: (i + 0.5) / SCALE),  # on a half of 1/SCALE: rounds to even
    st.integers(2**52, 2**53).map(lambda i: i / SCALE),  # two of them total past 2**53 (in 1/SCALE)
)


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[AggregationSpec], list[dict], list[int], list[int]]:
    """Aggregations (two of each function, random slides and spans), one entity's events, a shuffled arrival order,
    and read times from before its first event to long after its last."""
    aggregations = []
    for i, function in enumerate(sorted(TILED_FUNCTIONS) * 2):
        slide = draw(st.sampled_from([1, 3, 1000]))
        column = draw(st.sampled_from(["amount", "merchant"])) if function == "count_distinct" else "amount"
        aggregations.append(AggregationSpec(f"{function}_{i}", function, column, draw(st.integers(1, 4)) * slide, slide))
    amounts = draw(st.lists(AMOUNTS, min_size=1, max_size=4))
    event = st.tuples(st.integers(0, 4000), st.sampled_from(amounts), st.sampled_from(["m1", "m2", "m3"]))
    events = [{EVENT_TIME: START + t, "amount": a, "merchant": m} for t, a, m in draw(st.lists(event, min_size=1, max_size=30))]
    order = draw(st.permutations(range(len(events))))
    reads = draw(st.lists(st.integers(-100, 20_000), min_size=1, max_size=8))
    return aggregations, events, list(order), [START + t for t in reads]


def _tiles(aggregations: list[AggregationSpec], events: list[dict], order: list[int]) -> dict[int, dict[int, Tile]]:
    """Every slide's tiles of ``events`` folded in ``order``, through their stored form."""
    shapes = tile_shapes(aggregations)
    tiles: dict[int, dict[int, Tile]] = {slide: {} for slide in shapes}
    for i in order:
        for slide, shape in shapes.items():
            fold(tiles[slide], shape, events[i], events[i][EVENT_TIME])
    return {slide: dict(decode_tile(encode_tile(index, tile)) for index, tile in slide_tiles.items()) for slide, slide_tiles in tiles.items()}


def _folded(aggregations: list[AggregationSpec], events: list[dict], order: list[int]) -> tuple[dict, dict, int]:
    """Each slide's shape and folded tiles of ``events``, and the latest event time."""
    return tile_shapes(aggregations), _tiles(aggregations, events, order), max(e[EVENT_TIME] for e in events)


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_tiles_merged_at_any_read_time_equal_the_window_definition(case) -> None:
    aggregations, events, order, reads = case
    shapes, tiles, latest = _folded(aggregations, events, order)
    for at_ms in reads:
        for aggregation in aggregations:
            got = window_value(tiles[aggregation.slide_ms], shapes[aggregation.slide_ms], aggregation, at_ms, latest)
            assert got == window_by_definition(aggregation, events, at_ms), (aggregation, at_ms)


@settings(max_examples=150, deadline=None)
@given(_histories())
def test_at_the_latest_event_the_merge_is_the_jobs_window_and_long_after_it_every_window_is_empty(case) -> None:
    aggregations, events, order, _ = case
    shapes, tiles, latest = _folded(aggregations, events, order)
    frame = pd.DataFrame([{"user": "u", **e} for e in events])
    (row,) = recompute(ViewPlan("v", "user", "t", 0, tuple(aggregations), None), frame).to_dict("records")
    quiet = latest + max(a.window_ms for a in aggregations)  # every window has passed the last event's slide
    for aggregation in aggregations:
        shape = shapes[aggregation.slide_ms]
        at_latest = window_value(tiles[aggregation.slide_ms], shape, aggregation, latest, latest)
        expected = row[aggregation.name]
        assert at_latest == expected or (at_latest is None and isinstance(expected, float) and math.isnan(expected)), aggregation
        empty = 0 if aggregation.function in ("count", "count_distinct") else None
        assert window_value(tiles[aggregation.slide_ms], shape, aggregation, quiet, latest) == empty, aggregation


def test_a_read_before_the_latest_event_reads_as_of_it() -> None:
    count = AggregationSpec("n", "count", "amount", 10, 5)
    (shape,) = tile_shapes([count]).values()
    tiles: dict[int, Tile] = {}
    for t in (0, 4, 12):
        fold(tiles, shape, {"amount": 1.0}, t)
    assert window_value(tiles, shape, count, 3, 12) == window_value(tiles, shape, count, 12, 12) == 1  # tiles 1 and 2
    assert window_value(tiles, shape, count, 14, 12) == 1 and window_value(tiles, shape, count, 15, 12) == 1
    assert window_value(tiles, shape, count, 20, 12) == 0


@given(st.lists(st.binary(max_size=300), max_size=6))
def test_framed_tiles_split_back_into_the_tiles(tiles: list[bytes]) -> None:
    framed = b"".join(b"%d:" % len(tile) + tile for tile in tiles)  # TileBytes.frame's form
    assert split_tiles(framed) == tiles
