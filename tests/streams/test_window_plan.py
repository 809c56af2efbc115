"""The job's windows (the JVM ``WindowPlan``: tiles, their merge into steps) against a brute-force reading of the
window definition, on small random histories.

A Java driver (``tests/support/jvm``) feeds one entity's events, in a shuffled arrival order, to the job's own ``WindowPlan``
and answers its steps and finished values. Read at any request time through the reader's own ``Window.values_at``,
the steps equal the definition read event by event (``tests/support/window_definition.py``) and the offline recompute
(``streams/recompute.py``) read at that time; the finished values equal both at the latest event; long after it every
window is empty.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.window_tiles import SCALE, TILED_FUNCTIONS, AggregationSpec, Window, view_windows
from streams.feature_plan import MAX_EXACT_VALUE
from streams.recompute import overflowing, recompute, same_feature_value
from tests.support.jvm_driver import JvmDriver, jvm_driver
from tests.support.templates import EVENT_TIME, view_plan
from tests.support.window_definition import steps_by_definition, window_by_definition

START = 1_790_000_000_000
AMOUNTS = st.one_of(
    st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
    st.integers(0, 10**8).map(lambda i: (i + 0.5) / SCALE),  # on a half of 1/SCALE: rounds to even
    st.integers(2**52, 2**53).map(lambda i: i / SCALE),  # two of them total past 2**53 (in 1/SCALE)
)


class Replay:
    """The Java driver (``WindowsReplay``)."""

    def __init__(self, driver: JvmDriver) -> None:
        self.driver = driver

    def run(self, aggregations: list[AggregationSpec], events: list[dict], ttl_ms: int = 0) -> tuple[list[bytes], list]:
        """Each window's steps and each aggregation's finished value after absorbing ``events`` in their order, the
        features without a window looking back ``ttl_ms`` (0: for ever)."""
        answer = self.driver.ask(
            _plan(aggregations, ttl_ms), *(f"event {e[EVENT_TIME]} {e['amount']!r} {e['merchant']}" for e in events), "read"
        )
        return _parsed(answer)

    def offer(self, aggregations: list[AggregationSpec], events: list[dict]) -> tuple[list[str], list[bytes], list]:
        """Each event's answer (``absorbed`` or ``refused <column> <why>``) offered in turn, then each window's steps
        and each aggregation's finished value."""
        self.driver.tell(_plan(aggregations))
        answers = [self.driver.ask(f"offer {e[EVENT_TIME]} {e['amount']!r} {e['merchant']}") for e in events]
        return answers, *_parsed(self.driver.ask("read"))


def _plan(aggregations: list[AggregationSpec], ttl_ms: int = 0) -> str:
    """The driver's ``plan`` line: columns 1 amount, 2 merchant; then the ttl."""
    spec = ";".join(
        f"{a.name},{a.function},{1 if a.column == 'amount' else 2},{a.window_ms or 0},{a.slide_ms or 0}" for a in aggregations
    )
    return f"plan {spec} {ttl_ms}"


def _parsed(answer: str) -> tuple[list[bytes], list]:
    """The driver's ``read`` answer: each window's steps, each aggregation's finished value."""
    steps, finished = answer.split("|")
    return [bytes.fromhex(hexed) for hexed in steps.split()], [_value(v) for v in finished.split()]


def _value(text: str) -> object:
    """A finished value as the driver prints it: null, a count, a number, or a ``last`` text."""
    if text == "null":
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory):
    with jvm_driver(tmp_path_factory.mktemp("replay"), "WindowsReplay") as driver:
        yield Replay(driver)


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[AggregationSpec], list[dict], list[int]]:
    """Aggregations (two of each function, random slides and spans), one entity's events in a shuffled arrival order,
    and read times from before its first event to long after its last."""
    aggregations = []
    for i, function in enumerate(sorted(TILED_FUNCTIONS) * 2):
        slide = draw(st.sampled_from([1, 3, 1000]))
        column = draw(st.sampled_from(["amount", "merchant"])) if function == "count_distinct" else "amount"
        aggregations.append(AggregationSpec(f"{function}_{i}", function, column, draw(st.integers(1, 4)) * slide, slide))
    amounts = draw(st.lists(AMOUNTS, min_size=1, max_size=4))
    event = st.tuples(st.integers(0, 4000), st.sampled_from(amounts), st.sampled_from(["m1", "m2", "m3"]))
    events = [{EVENT_TIME: START + t, "amount": a, "merchant": m} for t, a, m in draw(st.lists(event, min_size=1, max_size=30))]
    reads = draw(st.lists(st.integers(-100, 20_000), min_size=1, max_size=8))
    return aggregations, draw(st.permutations(events)), [START + t for t in reads]


def _read(windows: dict[tuple[int, int], Window], steps: list[bytes], at_ms: int) -> dict[str, object]:
    """Every windowed aggregation's value read at ``at_ms`` from the job's ``steps``, through the reader's code."""
    return {
        a.name: value
        for window, raw in zip(windows.values(), steps, strict=True)
        for a, value in zip(window.aggregations, window.values_at(raw, at_ms), strict=True)
    }


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_the_jobs_steps_read_at_any_time_equal_the_window_definition(replay: Replay, case) -> None:
    aggregations, events, reads = case
    steps, finished = replay.run(aggregations, events)
    windows = view_windows(aggregations)
    latest = max(e[EVENT_TIME] for e in events)
    assert [window.latest_ms(raw) for window, raw in zip(windows.values(), steps, strict=True)] == [latest] * len(windows)
    assert steps == [steps_by_definition(window, events) for window in windows.values()]
    assert finished == [window_by_definition(a, events, latest) for a in aggregations]
    for at_ms in reads:
        assert _read(windows, steps, at_ms) == {a.name: window_by_definition(a, events, at_ms) for a in aggregations}, at_ms


@settings(max_examples=150, deadline=None)
@given(_histories())
def test_the_steps_equal_the_recompute_at_request_times_and_every_window_empties(replay: Replay, case) -> None:
    aggregations, events, reads = case
    steps, _ = replay.run(aggregations, events)
    windows = view_windows(aggregations)
    latest = max(e[EVENT_TIME] for e in events)
    quiet = latest + max(a.window_ms for a in aggregations)  # every window has passed the last event's slide
    frame = pd.DataFrame([{"user": "u", **e} for e in events])
    times = [t for t in (*reads, quiet) if t >= latest]  # the recompute reads the events up to each time
    at = pd.DataFrame({"user": "u", "at_ms": times})
    for row in recompute(view_plan("v", aggregations, keys=("user",), topic="t"), frame, at).to_dict("records"):
        read = _read(windows, steps, row["at_ms"])
        for a in aggregations:
            expected = row[a.name]
            assert same_feature_value(a.name, expected, read[a.name]), (a, row["at_ms"])
    assert _read(windows, steps, quiet) == {
        a.name: 0 if a.function in ("count", "count_distinct") else None for a in aggregations
    }


@settings(max_examples=150, deadline=None)
@given(
    st.permutations([START + t for t in (0, 7, 7, 40, 41, 300, 1_000, 1_004)]).flatmap(
        lambda times: st.tuples(st.just(times), st.integers(1, len(times)), st.sampled_from([0, 1, 4, 33, 299, 700, 5_000]))
    )
)
def test_features_without_a_window_look_back_the_ttl_alike_in_the_job_and_the_recompute(replay: Replay, case) -> None:
    """``time_since_previous`` and ``last`` of events arriving in any order, under any ttl: the job's values (as of
    the entity's latest event) are the recompute's, and none where the previous event is more than the ttl back."""
    times, count, ttl_ms = case
    events = [{EVENT_TIME: t, "amount": 1.0, "merchant": f"m{i}"} for i, t in enumerate(times[:count])]
    aggregations = [
        AggregationSpec("gap", "time_since_previous", EVENT_TIME, None, None),
        AggregationSpec("last", "last", "merchant", None, None),
    ]
    _, finished = replay.run(aggregations, events, ttl_ms)
    latest = max(e[EVENT_TIME] for e in events)
    frame = pd.DataFrame([{"user": "u", **e} for e in events])
    plan = dataclasses.replace(view_plan("v", aggregations, keys=("user",), topic="t"), ttl_ms=ttl_ms)
    (row,) = recompute(plan, frame, pd.DataFrame({"user": ["u"], "at_ms": [latest]})).to_dict("records")
    earlier = sorted({t for t in times[:count] if t < latest})
    gap = latest - earlier[-1] if earlier else None
    assert finished[0] == (gap / 1000 if gap is not None and (ttl_ms == 0 or gap <= ttl_ms) else None)
    assert same_feature_value("gap", row["gap"], finished[0]) and row["last"] == finished[1]


def test_a_read_before_the_latest_event_reads_as_of_it(replay: Replay) -> None:
    count = AggregationSpec("n", "count", "amount", 10, 5)
    events = [{EVENT_TIME: t, "amount": 1.0, "merchant": "m"} for t in (0, 4, 12)]
    (steps,), finished = replay.run([count], events)
    (window,) = view_windows([count]).values()
    assert finished == [1]  # tiles 1 and 2 hold the event at 12 only
    assert [window.values_at(steps, t)[0] for t in (3, 12, 14, 15, 20)] == [1, 1, 1, 1, 0]


def test_a_late_event_lands_in_its_tile_and_counts_until_that_tile_leaves(replay: Replay) -> None:
    total = AggregationSpec("sum", "sum", "amount", 30, 10)
    events = [{EVENT_TIME: t, "amount": a, "merchant": "m"} for t, a in ((25, 1.0), (41, 2.0), (22, 4.0))]  # 22 is late
    (steps,), finished = replay.run([total], events)
    (window,) = view_windows([total]).values()
    assert finished == [7.0]  # tiles 2, 3 and 4
    assert [window.values_at(steps, t)[0] for t in (41, 49, 50, 69, 70)] == [7.0, 7.0, 2.0, 2.0, None]


def test_an_event_that_would_take_a_tile_past_an_exact_total_is_refused_and_changes_nothing(replay: Replay) -> None:
    """An hour of 10 s tiles keeps 360: a tile may total ``(2**63 - 1) // 360`` units of 1/SCALE and no more, so that
    the window's sum of its tiles never wraps a long. Events of the largest value the decoder takes fill a tile until
    the next would pass that: it is refused, naming its column, and the windows hold the absorbed events only; a
    negative event still goes in, and a tile of its own takes the refused value."""
    total, mean = (
        AggregationSpec("s", "sum", "amount", 3_600_000, 10_000),
        AggregationSpec("m", "mean", "amount", 3_600_000, 10_000),
    )
    fit = (2**63 - 1) // 360 // round(MAX_EXACT_VALUE * SCALE)
    offered = [{EVENT_TIME: START + i, "amount": MAX_EXACT_VALUE, "merchant": "m1"} for i in range(fit + 2)]
    offered += [
        {EVENT_TIME: START + 50, "amount": -MAX_EXACT_VALUE, "merchant": "m1"},
        {EVENT_TIME: START + 10_000, "amount": MAX_EXACT_VALUE, "merchant": "m1"},
    ]
    answers, steps, finished = replay.offer([total, mean], offered)
    assert fit == 2 and answers[:fit] == ["absorbed"] * fit and answers[-2:] == ["absorbed"] * 2
    for refused in answers[fit : fit + 2]:
        assert refused.startswith("refused 1 ") and "past ±" in refused and "10000 ms tile" in refused, refused
    absorbed = [e for e, answer in zip(offered, answers, strict=True) if answer == "absorbed"]
    assert finished == [window_by_definition(a, absorbed, START + 10_000) for a in (total, mean)]
    assert steps == [steps_by_definition(window, absorbed) for window in view_windows([total, mean]).values()]
    frame = pd.DataFrame([{"user": "u", **e} for e in offered])
    assert list(overflowing(view_plan("v", [total, mean], keys=("user",), topic="t"), frame)) == [
        a != "absorbed" for a in answers
    ]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_recompute_refuses_the_events_the_jobs_windows_refuse(replay: Replay, data: st.DataObject) -> None:
    """Windows of up to 4,096 tiles over values near the largest the decoder takes, in a shuffled arrival order: the
    offline recompute's ``overflowing`` names exactly the events the job's ``WindowPlan`` refuses, and the job's
    values are the window definition's over the others."""
    aggregations = [
        AggregationSpec(f"{function}_{i}", function, "amount", span * slide, slide)
        for i, (function, slide, span) in enumerate(
            data.draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(["sum", "mean", "max", "count"]),
                        st.sampled_from([1, 1000]),
                        st.sampled_from([1, 3, 2048, 4096]),
                    ),
                    min_size=1,
                    max_size=3,
                )
            )
        )
    ]
    amounts = st.integers(2**50, 2**53).map(lambda i: i / SCALE) | st.integers(-(2**53), -(2**50)).map(lambda i: i / SCALE)
    events = [
        {EVENT_TIME: START + t, "amount": a, "merchant": "m1"}
        for t, a in data.draw(st.lists(st.tuples(st.integers(0, 3000), amounts), min_size=1, max_size=30))
    ]
    answers, _, finished = replay.offer(aggregations, events)
    frame = pd.DataFrame([{"user": "u", **e} for e in events])
    assert list(overflowing(view_plan("v", aggregations, keys=("user",), topic="t"), frame)) == [a != "absorbed" for a in answers]
    absorbed = [e for e, answer in zip(events, answers, strict=True) if answer == "absorbed"]
    if absorbed:
        latest = max(e[EVENT_TIME] for e in absorbed)
        assert finished == [window_by_definition(a, absorbed, latest) for a in aggregations]
