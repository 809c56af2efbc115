"""The offline recompute: the job's aggregations in batch over the raw event log, point in time.

This is what training sets and consistency checks use. It follows the window semantics of the
job's ``SlidingWindows`` operator (``streams/jvm``) but is written independently (pandas and numpy
over sorted arrays: binary search, running totals), so a test comparing the two really checks the
streaming path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from feature_store.window_tiles import COUNTING_FUNCTIONS, TILED_FUNCTIONS
from streams.feature_plan import SCALE, FeaturePlan, ViewPlan

if TYPE_CHECKING:
    from confluent_kafka import Message

#: The column of a recomputed row holding the time of the latest event it counts (whatever the events' time field).
LATEST_EVENT = "latest_event_ms"
#: Where an event lies in the log, beside its record's fields: partition, offset, and when it reached Kafka.
LOG_POSITION = ("partition", "offset", "kafka_ms")


def split_late(events: pd.DataFrame, out_of_orderness_ms: int, time_field: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Reproduce the job's lateness verdicts from the log: ``(accepted, late)``.

    ``events`` needs ``partition`` and ``offset`` columns besides the record's (one topic's). Within each
    partition, in offset order, an event is late when its time (``time_field``) is more than the bound behind the
    newest event time seen before it in that partition (the job's per-partition watermark).
    """
    ordered = events.sort_values(["partition", "offset"], kind="stable")
    newest_before = ordered.groupby("partition")[time_field].transform(lambda t: t.cummax().shift())
    late = ordered[time_field] < newest_before - out_of_orderness_ms
    return ordered[~late], ordered[late]


def recompute(plan: ViewPlan, events: pd.DataFrame, at: pd.DataFrame | None = None) -> pd.DataFrame:
    """Features of ``plan`` for entities at points in time, with the request-time semantics of the online read
    (``feature_store/window_tiles.py``).

    ``events`` holds the accepted events of the view's topic (the contract's fields). ``at`` holds
    ``(<entity key>, at_ms)`` pairs (``plan.entity_key``, or the view's join keys); without it, each entity is evaluated
    at its latest event.
    Each row is what a read at ``at_ms`` returns when the store has absorbed the entity's events up to
    that time: over the events at or before it, each window as of ``at_ms`` (its slide's tiles from
    ``floor(at_ms / slide) - window / slide`` exclusive), ``time_since_previous`` as of the latest of
    them, ``last`` the value of the latest of them that has one. Pairs with no event before ``at_ms`` are left out.
    Columns: the entity key, ``LATEST_EVENT`` (that latest event's time), ``at_ms`` when ``at`` is given, and one per
    feature. Rows come entity by entity (in order of their first event), each entity's points in the order asked.
    """
    key, time_field = plan.entity_key, plan.time_field
    events = plan.with_entity(events)
    events = events[~overflowing(plan, events)]
    asked_times = at is not None
    if at is None:
        at = events.groupby(key, as_index=False)[time_field].max().rename(columns={time_field: "at_ms"})
    at = plan.with_entity(at)
    ordered = events.sort_values(time_field, kind="stable")
    codes, entities = pd.factorize(ordered[key])  # numbered in order of first event; no key: -1, left out
    order = np.argsort(codes, kind="stable")
    order = order[codes[order] >= 0]
    timeline = _Timeline(codes[order], ordered[time_field].to_numpy()[order])
    point_codes = entities.get_indexer(at[key])
    asked = np.argsort(point_codes, kind="stable")
    asked = asked[point_codes[asked] >= 0]
    first = np.searchsorted(timeline.codes, point_codes[asked], side="left")
    at_ms = at["at_ms"].to_numpy()[asked]
    end = timeline.insertion_points(point_codes[asked], at_ms, "right")
    has_event = end > first
    times = ["at_ms"] if asked_times else []
    if not has_event.any():
        return pd.DataFrame([], columns=[key, LATEST_EVENT, *times, *plan.feature_names])
    first, end, at_ms = first[has_event], end[has_event], at_ms[has_event]
    columns = {
        column: ordered[column].to_numpy(dtype=object if column in plan.last_columns else None)[order]
        for column in {agg.column for agg in plan.aggregations if agg.column}
    }
    return pd.DataFrame(
        {
            key: entities.to_numpy()[timeline.codes[end - 1]],
            LATEST_EVENT: timeline.times[end - 1],
            **dict.fromkeys(times, at_ms),
            **_features(plan, columns, timeline, first, end, at_ms),
        }
    )


def overflowing(plan: ViewPlan, events: pd.DataFrame) -> np.ndarray:
    """Which of ``events`` (with ``plan.entity_key``) the job's windows refuse as an overflow (``WindowPlan.refusal``,
    a dead letter): an event whose value would take its tile's total (integers of 1/SCALE) past ``(2**63 - 1) // k``,
    ``k`` the most tiles a window of its slide keeps, so that no window's sum wraps. A refused event is not absorbed at
    all. Taken per entity in log order (``partition``, ``offset`` when given, else the frame's): the job's arrival
    order for an entity whose events come from one partition. A boolean per row of ``events``, in their order."""
    slides: dict[int, tuple[int, list[str]]] = {}  # slide ms -> (kept tiles, the columns it totals)
    for a in plan.aggregations:
        if a.function in TILED_FUNCTIONS and a.window_ms and a.slide_ms:
            kept, columns = slides.get(a.slide_ms, (0, []))
            if a.function not in COUNTING_FUNCTIONS and a.column not in columns:
                columns.append(a.column)
            slides[a.slide_ms] = (max(kept, a.window_ms // a.slide_ms), columns)
    refused = np.zeros(len(events), dtype=bool)
    totalled = {slide: (kept, columns) for slide, (kept, columns) in slides.items() if columns}
    if events.empty or not any(_may_overflow(plan, events, slide, kept, columns) for slide, (kept, columns) in totalled.items()):
        return refused
    positions = [column for column in ("partition", "offset") if column in events.columns]
    ordered = events.reset_index(drop=True)
    ordered = ordered.sort_values(positions, kind="stable") if positions else ordered
    for _, entity in ordered.groupby(plan.entity_key, sort=False):
        absorbed_latest, tiles = None, {slide: {} for slide in totalled}
        for row, ts, values in zip(entity.index, entity[plan.time_field], entity.to_dict("records"), strict=True):
            latest = ts if absorbed_latest is None else max(absorbed_latest, ts)  # a refused event moves nothing
            adds = []
            for slide, (kept, columns) in totalled.items():
                index = ts // slide
                if index < latest // slide - kept + 1:
                    continue  # too old for any window: the job drops it from the tiles
                held = tiles[slide].get(index, dict.fromkeys(columns, 0))
                adds.append(
                    (
                        slide,
                        index,
                        {column: held[column] + round(values[column] * SCALE) for column in columns},
                        (2**63 - 1) // kept,
                    )
                )
            if any(abs(total) > limit for _, _, totals, limit in adds for total in totals.values()):
                refused[row] = True
                continue
            absorbed_latest = latest
            for slide, index, totals, _ in adds:
                tiles[slide][index] = totals
    return refused


def _may_overflow(plan: ViewPlan, events: pd.DataFrame, slide: int, kept: int, columns: list[str]) -> bool:
    """Whether some tile of ``slide`` could pass the bound: the magnitudes of its events' values, summed per entity and
    tile (in doubles, with room for their rounding), pass it."""
    tile = events[plan.time_field] // slide
    magnitudes = events[columns].abs() * SCALE
    sums = magnitudes.groupby([events[plan.entity_key], tile]).sum()
    return bool((sums.to_numpy() > (2**63 - 1) // kept * 0.999).any())


class _Timeline:
    """Every entity's events in one array: entity after entity (by code), each entity's by time (ties in log order)."""

    def __init__(self, codes: np.ndarray, times: np.ndarray) -> None:
        self.codes, self.times = codes, times
        self._distinct_times = np.unique(times)
        # (code, rank of the time) as one sorted integer (below n**2 + n for n events), so placing a point among its
        # entity's events is one binary search.
        self._keys = codes * (len(self._distinct_times) + 1) + np.searchsorted(self._distinct_times, times)

    def insertion_points(self, codes: np.ndarray, times: np.ndarray, side: Literal["left", "right"]) -> np.ndarray:
        """Per point (entity code, time): ``np.searchsorted`` of the time among its entity's event times with ``side``,
        as an index into all events."""
        rank = np.searchsorted(self._distinct_times, times, side=side)
        return np.searchsorted(self._keys, codes * (len(self._distinct_times) + 1) + rank, side="left")


def _features(
    plan: ViewPlan, columns: dict[str, np.ndarray], timeline: _Timeline, first: np.ndarray, end: np.ndarray, at_ms: np.ndarray
) -> dict[str, np.ndarray | list]:
    """Every feature of ``plan`` per row: over the events up to the row's latest ``end - 1`` of ``timeline`` (``first``:
    its entity's first event), windows as of ``at_ms`` (no earlier than that latest event). ``columns``: the
    aggregated columns, in the timeline's order."""
    codes, latest = timeline.codes[end - 1], timeline.times[end - 1]
    starts: dict[tuple[int | None, int], np.ndarray] = {}
    totals: dict[str, np.ndarray] = {}
    features: dict[str, np.ndarray | list] = {}
    for agg in plan.aggregations:
        if agg.function == "time_since_previous":
            before = timeline.insertion_points(codes, latest, "left")
            has_previous = before > first
            gap = np.where(has_previous, latest - timeline.times[np.maximum(before - 1, 0)], 0)
            has_previous &= _within_ttl(plan, gap)
            features[agg.name] = _with_gaps(gap[has_previous] / 1000, has_previous)
            continue
        if agg.function == "last":
            values, times = _last_values(columns[agg.column], timeline, end)
            looked_back = _within_ttl(plan, latest - times)
            features[agg.name] = [value if kept else None for value, kept in zip(values, looked_back.tolist(), strict=True)]
            continue
        window = (agg.slide_ms, agg.window_buckets)
        if window not in starts:
            first_bucket = at_ms // agg.slide_ms - agg.window_buckets + 1
            # A window shorter than a bucket (only a hand-built plan has one) starts after the latest event: empty.
            starts[window] = np.minimum(timeline.insertion_points(codes, first_bucket * agg.slide_ms, "left"), end)
        start, values = starts[window], columns[agg.column]
        if agg.function == "count":
            features[agg.name] = end - start
        elif agg.function == "count_distinct":
            features[agg.name] = _distinct_counts(values, start, end)
        else:
            full = end > start
            if agg.function in ("sum", "mean"):
                if agg.column not in totals:
                    totals[agg.column] = _scaled_running_totals(values)
                window_total = totals[agg.column][end[full]] - totals[agg.column][start[full]]
                exact = window_total / SCALE if agg.function == "sum" else window_total / (end - start)[full] / SCALE
                result = exact.astype(np.float64)
            else:
                result = _extremes(values, start[full], end[full], agg.function)
            features[agg.name] = _with_gaps(result, full)
    return features


def _value_order(value) -> tuple:
    """Where a value of one column orders among the others when events tie in time: as the job's ``WindowPlan`` orders
    them (strings by UTF-16 units, numbers as Java's ``Double.compare``: -0.0 before 0.0, false before true)."""
    if isinstance(value, str):
        return (value.encode("utf-16-be"),)
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else (value,)


def _within_ttl(plan: ViewPlan, ago_ms: np.ndarray) -> np.ndarray:
    """Which of the events ``ago_ms`` before a row's latest event its features without a window still look back to:
    all, or those within the view's ttl (``WindowPlan``)."""
    return np.ones(len(ago_ms), dtype=bool) if not plan.ttl_ms else ago_ms <= plan.ttl_ms


def _last_values(values: np.ndarray, timeline: _Timeline, end: np.ndarray) -> tuple[list, np.ndarray]:
    """Per row, the value of the latest event up to ``end - 1`` of its entity that has one (of events at one time,
    the greatest value), and that event's time; None (and the row's latest time) when none has. Each event gets a
    rank by (time, value), and a running maximum of ``code * (events + 1) + rank`` (codes ascending) keeps each
    entity's best so far without crossing entities."""
    present = np.array([value is not None and value == value for value in values.tolist()], dtype=bool)
    count = len(values)
    ranks = np.zeros(count, dtype=np.int64)
    if present.any():
        listed = values.tolist()
        distinct = sorted({v for v, p in zip(listed, present.tolist(), strict=True) if p}, key=_value_order)
        where = {(type(v), v): i for i, v in enumerate(distinct)}
        value_rank = np.array([where[(type(v), v)] if p else -1 for v, p in zip(listed, present.tolist(), strict=True)])
        order = np.lexsort((value_rank, timeline.times))  # by time, then by value
        order = order[present[order]]
        ranks[order] = np.arange(1, len(order) + 1)
    best = np.maximum.accumulate(timeline.codes.astype(np.int64) * (count + 1) + ranks)
    rows = best[end - 1] - timeline.codes[end - 1].astype(np.int64) * (count + 1)
    by_rank = np.empty(count + 1, dtype=object)
    by_rank[ranks[present]] = values[present]
    time_by_rank = np.zeros(count + 1, dtype=np.int64)
    time_by_rank[ranks[present]] = timeline.times[present]
    times = np.where(rows == 0, timeline.times[end - 1], time_by_rank[rows])
    return [None if rank == 0 else by_rank[rank] for rank in rows.tolist()], times


def _scaled_running_totals(values: np.ndarray) -> np.ndarray:
    """Running totals (from 0) of the values as integers of 1/SCALE: a window's total is the difference of two.

    Python ints (an object array), so totals and their division are exact as a plain ``sum`` of the rounded values:
    a history's running total may pass 64 bits, and a window's total 53."""
    return np.cumsum([0, *(round(value * SCALE) for value in values.tolist())], dtype=object)


def _distinct_counts(values: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many distinct values each window ``values[start:end]`` holds: a set per window, as for a single point (no
    prefix trick counts distinct values; at these window sizes the sets are a small share of a replay)."""
    return np.array([len(set(values[s:e].tolist())) for s, e in zip(start.tolist(), end.tolist(), strict=True)], dtype=np.int64)


def _extremes(values: np.ndarray, start: np.ndarray, end: np.ndarray, function: str) -> np.ndarray:
    """``max`` or ``min`` of each non-empty window ``values[start:end]``, from a sparse table: level k holds the extreme of
    each span of 2**k values, and two such spans, overlapping, cover a window."""
    keep_left = np.greater_equal if function == "max" else np.less_equal
    length = end - start
    level = np.frexp(length)[1] - 1  # floor(log2(length))
    found = np.empty(len(start), dtype=values.dtype)
    table, span = values, 1
    for k in range(int(level.max(initial=-1)) + 1):
        if k:
            # On a tie the left one, as max() and min() keep the first (0.0 and -0.0 are equal but not the same value).
            table = np.where(keep_left(table[:-span], table[span:]), table[:-span], table[span:])
            span *= 2
        here = level == k
        left, right = table[start[here]], table[end[here] - span]
        found[here] = np.where(keep_left(left, right), left, right)
    return found


def _with_gaps(values: np.ndarray, present: np.ndarray) -> np.ndarray | list:
    """A column of ``values`` where ``present`` (in order), None elsewhere: a list then, so the frame infers its type
    as it would from rows (floats with None become NaN, None alone stays None)."""
    if present.all():
        return values
    column = np.full(len(present), None, dtype=object)
    column[present] = values
    return column.tolist()


def same_feature_value(feature: str, offline, online) -> bool:
    """Whether an online value equals the recompute's: exactly (texts and booleans too), except a mean within a relative
    1e-9 (one division of exact sums); both missing counts as equal."""
    if offline is None or online is None or pd.isna(offline) or pd.isna(online):
        return (offline is None or bool(pd.isna(offline))) and (online is None or bool(pd.isna(online)))
    if isinstance(offline, (str, bool, np.bool_)) or isinstance(online, (str, bool)):
        return offline == online
    return abs(offline - online) <= (1e-9 * abs(offline) if "mean" in feature else 0)


def feature_differences(
    plan: FeaturePlan, expected: dict[str, pd.DataFrame], read: Callable[[ViewPlan, pd.DataFrame], pd.DataFrame]
) -> list[str]:
    """Every (view, entity, feature) where ``read(view, expected frame)`` differs from the recompute in
    ``expected`` (by view; both frames with the view's ``entity_key``): exact, except means within a relative 1e-9 (one
    division of exact sums)."""
    problems = []
    for view in plan.views:
        offline = expected[view.name]
        merged = offline.merge(read(view, offline), on=view.entity_key, suffixes=("_offline", "_online"))
        if len(merged) != len(offline):
            problems.append(f"{view.name}: {len(offline) - len(merged)} entities missing")
        for feature in view.feature_names:
            for entity, want, got in zip(
                merged[view.entity_key], merged[f"{feature}_offline"], merged[f"{feature}_online"], strict=True
            ):
                if not same_feature_value(feature, want, got):
                    problems.append(f"{view.name}[{entity}].{feature}: online {got}, offline {want}")
    return problems


def valid_events(plan: FeaturePlan, topic: str, messages: Iterable[Message]) -> pd.DataFrame:
    """The events among ``topic``'s Kafka ``messages`` that the job takes in: decoded by the topic's contract (JSON or
    Avro, as the job decodes them) and within the engine's range; each with its partition, offset and the time it
    reached Kafka (``kafka_ms``). The same columns when there is none."""
    from schemas.validation import ContractViolation

    source = plan.source(topic)
    valid = []
    for message in messages:
        try:
            event = source.contract.decode(message.value() or b"", source.wire).model_dump()
        except ContractViolation:
            continue
        if plan.out_of_range(topic, event) is None:
            valid.append(
                {**event, "partition": message.partition(), "offset": message.offset(), "kafka_ms": message.timestamp()[1]}
            )
    return pd.DataFrame(valid, columns=[*source.contract.field_names, *LOG_POSITION])


def accepted_events(plan: FeaturePlan, topic: str, messages) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(accepted, late)`` events among ``topic``'s Kafka ``messages``, as the job judges them: the ``valid_events``,
    split by ``split_late``."""
    source = plan.source(topic)
    return split_late(valid_events(plan, topic, messages), source.out_of_orderness_ms, source.time_field)
