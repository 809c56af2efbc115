"""The vectorised recompute against a brute-force reading of the window semantics, point by point, on small random logs.

The reference below is the definition, not an algorithm: for each point, the entity's events at or before it; the
latest of them; each window from the bucket ``point // slide - buckets + 1`` up to the point (request time); sums and
means as exact sums of values rounded to 1/SCALE. Logs have several entities, equal timestamps, rows out of order,
values with many decimals or on a half of 1/SCALE, totals past 2**53, points before an entity's first event and
windows shorter than a bucket (empty).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal

from feature_store.window_tiles import TILED_FUNCTIONS
from feedback_loop.consistency import features_at
from streams.feature_plan import SCALE, AggregationSpec, ViewPlan
from streams.recompute import LATEST_EVENT, recompute
from tests.support.templates import EVENT_TIME, view_plan

START = 1_790_000_000_000
AMOUNTS = st.one_of(
    st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
    st.integers(0, 10**8).map(lambda i: (i + 0.5) / SCALE),  # on a half of 1/SCALE: rounds to even
    st.sampled_from([0.1, 0.2, 0.3, 2.5e-6, 1e-7]),
    st.integers(2**52, 2**53).map(lambda i: i / SCALE),  # two of them total past 2**53 (in 1/SCALE)
)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[ViewPlan, pd.DataFrame, pd.DataFrame]:
    unit = draw(st.sampled_from([1, 7, 250]))
    aggregations = [AggregationSpec("since_previous", "time_since_previous", EVENT_TIME, None, None)]
    for i, function in enumerate(sorted(TILED_FUNCTIONS) * 2):
        slide = draw(st.sampled_from([1, 3, 1000]))
        buckets = draw(st.integers(0, 4))  # 0: a window shorter than a bucket, empty
        column = draw(st.sampled_from(["amount", "country"])) if function == "count_distinct" else "amount"
        aggregations.append(AggregationSpec(f"{function}_{i}", function, column, buckets * slide, slide))
    plan = view_plan("v", aggregations, keys=("user",), topic="t")
    # Amounts from a few per log, so that windows hold equal values and large ones together; zeros of both signs
    # (equal, not the same: a maximum or minimum keeps the first).
    amounts = draw(st.lists(AMOUNTS, min_size=1, max_size=4)) + draw(st.sampled_from([[], [0.0, -0.0]]))
    event = st.tuples(st.sampled_from("abc"), st.integers(0, 40), st.sampled_from(amounts), st.sampled_from(["FR", "DE", "US"]))
    events = draw(st.lists(event, max_size=40))
    points = draw(st.lists(st.tuples(st.sampled_from("abcz"), st.integers(-5, 50)), max_size=15))
    return (
        plan,
        pd.DataFrame(
            [{"user": u, EVENT_TIME: START + t * unit, "amount": a, "country": c} for u, t, a, c in events],
            columns=["user", EVENT_TIME, "amount", "country"],
        ),
        pd.DataFrame([{"user": u, "at_ms": START + t * unit} for u, t in points], columns=["user", "at_ms"]),
    )


def _reference_row(plan: ViewPlan, history: list[dict], at_ms: int) -> dict | None:
    """The features of one entity (``history``: its events in time order) at ``at_ms``, straight from the semantics."""
    past = [e for e in history if e[EVENT_TIME] <= at_ms]
    if not past:
        return None
    latest = max(e[EVENT_TIME] for e in past)
    row: dict = {plan.entity_key: past[0][plan.entity_key], LATEST_EVENT: latest, "at_ms": at_ms}
    for agg in plan.aggregations:
        if agg.function == "time_since_previous":
            earlier = [e[EVENT_TIME] for e in past if e[EVENT_TIME] < latest]
            row[agg.name] = (latest - max(earlier)) / 1000 if earlier else None
            continue
        window_start = (at_ms // agg.slide_ms - agg.window_buckets + 1) * agg.slide_ms
        values = [e[agg.column] for e in past if e[EVENT_TIME] >= window_start]
        if agg.function == "count":
            row[agg.name] = len(values)
        elif agg.function == "count_distinct":
            row[agg.name] = len(set(values))
        elif not values:
            row[agg.name] = None
        elif agg.function in ("max", "min"):
            row[agg.name] = max(values) if agg.function == "max" else min(values)
        else:
            total = sum(round(value * SCALE) for value in values)
            row[agg.name] = total / SCALE if agg.function == "sum" else total / len(values) / SCALE
    return row


def _reference(plan: ViewPlan, events: pd.DataFrame, at: pd.DataFrame, times: bool) -> pd.DataFrame:
    """Rows entity by entity, in order of their first event, each entity's points in the order asked (with ``times``,
    the ``at_ms`` column too)."""
    log = sorted(events.to_dict("records"), key=lambda e: e[EVENT_TIME])
    rows = []
    for entity in dict.fromkeys(e["user"] for e in log):
        history = [e for e in log if e["user"] == entity]
        rows += [row for at_ms in at.loc[at["user"] == entity, "at_ms"] if (row := _reference_row(plan, history, at_ms))]
    return pd.DataFrame(rows, columns=["user", LATEST_EVENT, *(["at_ms"] if times else []), *plan.feature_names])


def _same(a: object, b: object) -> bool:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return bool(pd.isna(a)) and bool(pd.isna(b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_the_recompute_equals_the_window_semantics_point_by_point(case: tuple[ViewPlan, pd.DataFrame, pd.DataFrame]) -> None:
    plan, events, at = case
    for points, expected in (
        (at, _reference(plan, events, at, True)),
        (
            None,
            _reference(
                plan,
                events,
                events.groupby("user", as_index=False)[EVENT_TIME].max().rename(columns={EVENT_TIME: "at_ms"}),
                False,
            ),
        ),
    ):
        got = recompute(plan, events, points)
        assert_frame_equal(got, expected, check_exact=True)
        for column in got.columns[got.dtypes == np.float64]:  # bit for bit: the sign of a zero maximum too
            assert (got[column].to_numpy().view(np.int64) == expected[column].to_numpy().view(np.int64)).all(), column

    found = features_at(plan, events, at)
    log = sorted(events.to_dict("records"), key=lambda e: e[EVENT_TIME])
    for entity, at_ms in set(zip(at["user"], at["at_ms"], strict=True)):
        want = _reference_row(plan, [e for e in log if e["user"] == entity], at_ms)
        got = found.get((entity, at_ms))
        if want is None:
            assert got is None, (entity, at_ms)
        else:
            assert got is not None and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want), (got, want)
