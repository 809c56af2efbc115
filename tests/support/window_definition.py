"""The window definition read event by event: the reference the job's steps and the request-time read are held to.

A read at ``t`` of an entity whose latest event is at ``T`` counts each event whose slide ``floor(ts / slide)`` lies
in ``(floor(t' / slide) - window / slide, floor(t' / slide)]``, with ``t' = max(t, T)``
(``feature_store/window_tiles.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from feature_store.window_tiles import SCALE, AggregationSpec, Window
from tests.support.templates import EVENT_TIME


def window_by_definition(aggregation: AggregationSpec, events: Sequence[Mapping], at_ms: int):
    """``aggregation``'s value read at ``at_ms`` over one entity's ``events`` (each with ``event_time_ms``)."""
    slide, spans = aggregation.slide_ms, aggregation.window_buckets
    head = max(at_ms, max(e[EVENT_TIME] for e in events)) // slide
    values = [e[aggregation.column] for e in events if head - spans < e[EVENT_TIME] // slide <= head]
    if aggregation.function == "count":
        return len(values)
    if aggregation.function == "count_distinct":
        return len(set(values))
    if not values:
        return None
    if aggregation.function in ("max", "min"):
        return max(values) if aggregation.function == "max" else min(values)
    total = sum(round(value * SCALE) for value in values)
    return total / SCALE if aggregation.function == "sum" else total / len(values) / SCALE


def steps_by_definition(window: Window, events: Sequence[Mapping]) -> bytes:
    """The steps of ``window`` over one entity's ``events`` in their stored form, from the definition alone: for each
    slide with events inside the window at the latest event, the window read at the last head tile that still
    holds that slide."""
    latest = max(e[EVENT_TIME] for e in events)
    span, head = window.window_ms // window.slide_ms, latest // window.slide_ms
    tiles = sorted({e[EVENT_TIME] // window.slide_ms for e in events} & set(range(head - span + 1, head + 1)))
    return window.encode(
        latest,
        [
            (k + span, tuple(window_by_definition(a, events, (k + span - 1) * window.slide_ms) for a in window.aggregations))
            for k in tiles
        ],
    )
