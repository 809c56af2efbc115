"""Distribution skew measures: PSI, Jensen–Shannon and L∞ against a snapshot's reference, from counts that add up."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedback_loop.drift import SHARE_FLOOR, SkewThresholds, count_values, feature_skew, js_divergence, psi, skew_check
from feedback_loop.feature_log import PROBLEMS, FeatureLogWindow
from feedback_loop.reference import bin_counts, reference_statistics
from schemas.records import PredictionRecord

RNG = np.random.default_rng(0)
AMOUNTS = RNG.lognormal(3, 1, 50_000)
CHANNELS = RNG.choice(["web", "app", "pos"], 50_000, p=[0.5, 0.3, 0.2])
REFERENCE = reference_statistics(
    pd.DataFrame({"amount": AMOUNTS[:25_000], "channel": CHANNELS[:25_000].astype(object)}), ["amount", "channel"]
)
THRESHOLDS = SkewThresholds()


def test_the_same_distribution_is_stable_and_a_shifted_one_alerts() -> None:
    same = skew_check(REFERENCE, {"amount": AMOUNTS[25_000:], "channel": CHANNELS[25_000:].astype(object)})
    assert [s.level(THRESHOLDS) for s in same] == ["ok", "ok"], same
    assert same[0].psi < 0.01 and same[0].js_divergence < 0.01 and same[1].linf < 0.02

    shifted_amounts = AMOUNTS[25_000:] * 2.5  # a price rise, or a currency bug (x1.6 measured PSI 0.20: a warning)
    moved_channels = RNG.choice(["web", "app", "pos"], 25_000, p=[0.3, 0.5, 0.2]).astype(object)
    shifted = skew_check(REFERENCE, {"amount": shifted_amounts, "channel": moved_channels})
    assert shifted[0].psi >= 0.25 and shifted[0].level(THRESHOLDS) == "alert"
    assert shifted[1].linf == pytest.approx(0.2, abs=0.02) and shifted[1].level(THRESHOLDS) == "alert"
    assert shifted[0].linf is None and shifted[1].js_divergence is None


def test_missing_defaulted_and_new_categories_are_counted() -> None:
    values = np.where(np.arange(1_000) % 10 == 0, np.nan, AMOUNTS[:1_000])
    counts = count_values(REFERENCE["amount"], values, defaulted=np.arange(1_000) % 4 == 0)
    skew = feature_skew("amount", REFERENCE["amount"], counts)
    assert skew.missing_rate == pytest.approx(0.1) and skew.defaulted_rate == pytest.approx(0.25) and skew.rows == 1_000

    unseen = count_values(REFERENCE["channel"], ["kiosk"] * 300 + [None] * 100)
    skew = feature_skew("channel", REFERENCE["channel"], unseen)
    assert skew.linf == pytest.approx(1.0) and skew.missing_rate == pytest.approx(0.25)
    # No value at all: nothing to compare, no alert on an empty window.
    empty = feature_skew("amount", REFERENCE["amount"], count_values(REFERENCE["amount"], np.full(50, np.nan)))
    assert empty.psi is None and empty.level(THRESHOLDS) == "ok" and empty.missing_rate == 1.0


shares = st.lists(st.floats(0, 1), min_size=2, max_size=12).filter(lambda xs: sum(xs) > 0).map(lambda xs: np.array(xs) / sum(xs))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_js_is_bounded_and_symmetric_and_psi_is_zero_only_for_equal_shares(data) -> None:
    p = data.draw(shares)
    q = data.draw(st.lists(st.floats(0, 1), min_size=len(p), max_size=len(p)).filter(lambda xs: sum(xs) > 0))
    q = np.array(q) / sum(q)

    # Jensen-Shannon by its other definition, H(m) - (H(p) + H(q)) / 2 in bits: bounded by 1 and symmetric.
    def entropy(x: np.ndarray) -> float:
        x = x[x > 1e-300]
        return float(-np.sum(x * np.log2(x)))

    expected = entropy((p + q) / 2) - (entropy(p) + entropy(q)) / 2
    assert js_divergence(p, q) == pytest.approx(expected, abs=1e-9) and 0.0 <= js_divergence(p, q) <= 1.0 + 1e-9
    assert js_divergence(p, q) == pytest.approx(js_divergence(q, p), abs=1e-9)
    assert psi(p, p) == pytest.approx(0.0, abs=1e-12)
    floored = np.maximum(p, SHARE_FLOOR), np.maximum(q, SHARE_FLOOR)
    if np.max(np.abs(floored[0] - floored[1])) > 1e-6:  # shares that differ above the floor: PSI is positive
        assert psi(p, q) > 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-10, 500, allow_nan=False)), max_size=300), st.integers(0, 300))
def test_window_counts_add_up_to_the_counts_of_all_rows(values: list, cut: int) -> None:
    numbers = np.array([np.nan if v is None else v for v in values])
    reference = REFERENCE["amount"]
    whole = count_values(reference, numbers)
    assert count_values(reference, numbers[:cut]) + count_values(reference, numbers[cut:]) == whole
    assert sum(whole.bins) + whole.missing == whole.rows == len(values)
    labels = [None if v is None else ("web" if v > 100 else "app") for v in values]
    assert count_values(REFERENCE["channel"], labels[:cut]) + count_values(REFERENCE["channel"], labels[cut:]) == count_values(
        REFERENCE["channel"], labels
    )


def _prediction(i: int, amount: float | None, at_ms: int, version: str = "3", features: dict | None = None) -> PredictionRecord:
    return PredictionRecord(
        schema_version=1,
        request_id=f"r{i}",
        entity_keys={"user_id": f"u{i}"},
        features={"amount": amount, "channel": "web"} if features is None else features,
        defaulted_features=["amount"] if amount is None and features is None else [],
        model_name="m",
        model_version=version,
        score=0.5,
        requested_at_ms=at_ms,
        scored_at_ms=at_ms,
    )


def test_the_feature_log_window_adds_buckets_and_forgets_what_left_the_window() -> None:
    store: dict = {}
    window = FeatureLogWindow(store, "snap-a", REFERENCE, bucket_ms=60_000, window_ms=300_000)
    minute, t0 = 60_000, 29_833_334 * 60_000  # t0: a minute's start
    old = [_prediction(i, float(AMOUNTS[i]), t0 + i) for i in range(500)]
    recent = [_prediction(i, float(AMOUNTS[i] * 3), t0 + 6 * minute + i) for i in range(500)]
    canary = [_prediction(i, None, t0 + 6 * minute + i, version="4") for i in range(100)]
    assert window.add(old, partition=0) + window.add(recent, partition=1) + window.add(canary, partition=1) == 1_100

    at_7 = window.window(t0 + 7 * minute)  # the window (2, 7] minutes: only the recent buckets
    assert at_7["3"]["amount"].rows == 500 and at_7["4"]["amount"].defaulted == 100
    skews = {s.feature: s for s in window.skews(t0 + 7 * minute)["3"]}
    assert skews["amount"].psi > 0.25 and skews["channel"].linf > 0.4  # all "web" against half
    assert window.window(t0 + 5 * minute)["3"]["amount"].rows == 1_000  # (0, 5]: both
    assert window.stale(t0 + 7 * minute) == [f"snap-a|3|{t0}|0"]

    # A new reference (another prod snapshot) counts from scratch; the old counts only age out.
    window.use("snap-b", REFERENCE)
    assert window.window(t0 + 7 * minute) == {}
    window.add(recent[:10], partition=1)
    assert window.window(t0 + 7 * minute)["3"]["amount"].rows == 10


def test_reads_that_defaulted_every_stored_input_are_left_out_of_the_reference_and_the_window() -> None:
    """A read over its budget (every stored input on its default) says nothing of the features' distribution; in the
    delivery demo the first second of live traffic was 14 % of the first snapshot and moved every windowed feature."""
    inputs = ["amount", "channel", "request:x"]
    read = pd.DataFrame({"amount": AMOUNTS[:1_000], "channel": CHANNELS[:1_000].astype(object), "request:x": 1.0, "defaulted": 0})
    overran = read.iloc[:300].assign(amount=0.0, channel="web", defaulted=2)  # both stored inputs defaulted
    partly = read.iloc[:300].assign(amount=0.0, defaulted=1)  # one: a new entity, say; a value like any other
    assert reference_statistics(pd.concat([read, overran]), inputs) == reference_statistics(read, inputs)
    assert reference_statistics(pd.concat([read, partly]), inputs)["amount"] != reference_statistics(read, inputs)["amount"]

    window = FeatureLogWindow({}, "snap-a", REFERENCE, bucket_ms=60_000, window_ms=300_000)
    t0 = 29_833_334 * 60_000
    good = [_prediction(i, float(AMOUNTS[i]), t0 + i) for i in range(10)]
    over = [
        _prediction(i, None, t0 + i, features={"amount": 0.0, "channel": "web"}).model_copy(
            update={"defaulted_features": ["amount", "channel"]}
        )
        for i in range(10, 15)
    ]
    assert window.add(good + over, partition=0) == 10
    assert window.window(t0 + 60_000)["3"]["amount"].rows == 10


def test_a_record_counted_already_is_skipped_by_its_offset() -> None:
    window = FeatureLogWindow({}, "snap-a", REFERENCE, bucket_ms=60_000, window_ms=300_000)
    t0 = 29_833_334 * 60_000
    records = [_prediction(i, float(AMOUNTS[i]), t0 + i) for i in range(10)]
    assert sum(window.add([r], partition=2, offset=100 + i) for i, r in enumerate(records)) == 10
    # A restarted consumer re-reads offsets 105-109 (its last commit covered 104), then goes on.
    assert sum(window.add([r], partition=2, offset=100 + i) for i, r in enumerate(records) if i >= 5) == 0
    assert window.add([records[0]], partition=2, offset=110) == 1
    assert window.window(t0 + 60_000)["3"]["amount"].rows == 11


def test_odd_but_valid_records_count_as_the_reference_counted_them_or_are_bad_by_reason() -> None:
    """Values the contract lets through, each among good records of one batch: counted where the reference would have
    counted them, or left out whole with the reason, and the good records counted exactly once."""
    window = FeatureLogWindow({}, "snap-a", REFERENCE, bucket_ms=60_000, window_ms=300_000)
    t0, top = 29_833_334 * 60_000, len(REFERENCE["amount"].edges)
    odd = [  # (features, model version, expected problem)
        ({"amount": "abc", "channel": "web"}, "3", "wrong_type"),
        ({"amount": "12.5", "channel": "web"}, "3", "wrong_type"),  # a number's text is still a string
        ({"amount": 10**400, "channel": "web"}, "3", "not_finite"),  # beyond a double
        ({"amount": float("inf"), "channel": "web"}, "3", "not_finite"),
        ({"amount": float("-inf"), "channel": "web"}, "3", "not_finite"),
        ({"amount": 5.0, "channel": 10**400}, "3", "not_finite"),  # a category must be finite too
        ({}, "3", "no_features"),
        ({"amount": True, "channel": "web"}, "odd", None),  # 1.0: the first bin
        ({"amount": 10**40, "channel": "web"}, "odd", None),  # beyond float32, within a double: the top bin
        ({"amount": float("nan"), "channel": "web"}, "odd", None),  # missing
        ({"amount": 5.0, "channel": 7}, "odd", None),  # the category "7"
        ({"amount": 5.0, "channel": False}, "odd", None),  # the category "False"
        ({"amount": 5.0, "channel": "web", "unknown": "abc", "also:unknown": float("inf")}, "odd", None),  # not measured
        ({"channel": "web"}, "odd", None),  # amount missing
        ({"amount": 5.0, "channel": "web"}, "never|seen", None),  # a version no key has held, with the key's separator
    ]
    good = [_prediction(i, float(AMOUNTS[i]), t0 + i) for i in range(40)]
    batch = [
        record
        for i, (features, version, _) in enumerate(odd)
        for record in (good[2 * i], good[2 * i + 1], _prediction(100 + i, None, t0 + i, version, features))
    ]
    batch += good[2 * len(odd) :]
    odd_records = batch[2::3][: len(odd)]
    assert [window.problem(r) for r in odd_records] == [problem for _, _, problem in odd]
    assert window.add(batch) == len(good) + sum(problem is None for _, _, problem in odd)

    counts = window.window(t0 + 60_000)
    assert counts["3"]["amount"].rows == len(good) and counts["3"]["amount"].missing == 0
    assert counts["3"]["amount"].bins == tuple(bin_counts(AMOUNTS[:40], REFERENCE["amount"].edges))
    strange = counts["odd"]
    assert strange["amount"].rows == strange["channel"].rows == 7 and strange["amount"].missing == 2
    assert strange["amount"].bins[0] == 1 + 3 and strange["amount"].bins[top] == 1  # True, the three 5.0s; 1e40
    assert dict(strange["channel"].categories) == {"7": 1, "False": 1, "web": 5}
    assert "unknown" not in strange and counts["never|seen"]["amount"].rows == 1
    assert set(window.skews(t0 + 60_000)) == {"3", "odd", "never|seen"}
    assert window.stale(t0 + 60_000 + 300_000, partition=0) == [
        f"snap-a|3|{t0}|0",
        f"snap-a|odd|{t0}|0",
        f"snap-a|never|seen|{t0}|0",
    ]


# What JSON can carry into a contract-valid feature vector: every kind of number (NaN, ±Infinity, integers beyond a
# double or float32), booleans, any text, null; under referenced names and others, in any model version.
json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from([10**400, -(10**400), 2**1024, int(sys.float_info.max), 3 * 10**38, -(2**63)]),
)
feature_vectors = st.dictionaries(st.sampled_from(["amount", "channel", "unknown", "request:amount"]), json_values, max_size=4)
odd_records = st.builds(
    lambda i, features, version, at: _prediction(i, None, at, version, features),
    st.integers(0, 10**6),
    feature_vectors,
    st.text(min_size=1, max_size=6),
    st.integers(1, 2**70),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(odd_records, max_size=30), st.booleans())
def test_counting_any_contract_valid_records_never_raises_and_each_ends_counted_or_bad(records: list, one_by_one: bool) -> None:
    window = FeatureLogWindow({}, "snap-a", REFERENCE, bucket_ms=60_000, window_ms=300_000)
    problems = [window.problem(r) for r in records]
    assert set(problems) <= {None, *PROBLEMS}
    if one_by_one:  # as the monitor counts: one record per source offset
        counted = sum(window.add([r], partition=1, offset=i) for i, r in enumerate(records))
    else:
        counted = window.add(records, partition=1)
    kept = [r for r, problem in zip(records, problems, strict=True) if problem is None]
    assert counted == len(kept), "every record without a problem counted, and none with one"

    now = max((r.scored_at_ms for r in records), default=0)
    totals = window.window(now)
    for version in {r.model_version for r in kept}:
        rows = sum(r.model_version == version and r.scored_at_ms // 60_000 * 60_000 + 60_000 > now - 300_000 for r in kept)
        assert (version in totals) == (rows > 0)
        for name in REFERENCE if rows else ():
            counts = totals[version][name]
            assert counts.rows == rows and sum(counts.bins) + sum(n for _, n in counts.categories) + counts.missing == rows
    window.skews(now)
    assert set(window.stale(now + 10**9)) == set(window.store)


def test_a_unit_bug_in_a_dozen_zone_feature_still_reaches_the_delivery_templates_own_thresholds() -> None:
    """The delivery template judges its zone features only for gross shifts (``monitoring.skew_thresholds``): a value
    per zone (a dozen levels, as measured in its demo: 78–152 couriers, uneven request shares, 2 % read as the
    default 0), so a unit bug multiplies every level by 100. It must still alert under the template's thresholds."""
    from feedback_loop.settings import SkewThresholdSettings
    from loopline.project import template_path
    from schemas.project import load_project

    name = "zone_courier_features:couriers_15m"
    limits = load_project(template_path("delivery")).spec.monitoring.skew_thresholds[name]
    thresholds = SkewThresholdSettings(**limits).thresholds()
    rng = np.random.default_rng(3)
    levels = np.array([81, 112, 92, 114, 152, 124, 108, 144, 115, 78, 103, 78], dtype=float)
    shares = rng.dirichlet(np.full(len(levels), 4.0))
    zones = rng.choice(len(levels), 6_000, p=shares)
    values = np.round(levels[zones] + rng.normal(0, 0.5, zones.size))  # tight: some decile edges merge
    values[rng.random(values.size) < 0.02] = 0.0
    reference = reference_statistics(pd.DataFrame({name: values[:3_000]}), [name])[name]
    healthy = feature_skew(name, reference, count_values(reference, values[3_000:]))
    unit_bug = feature_skew(name, reference, count_values(reference, np.where(values[3_000:] > 0, values[3_000:] * 100, 0.0)))
    assert healthy.level(thresholds) == "ok", healthy
    assert unit_bug.level(thresholds) == "alert" and unit_bug.psi >= thresholds.psi_alert, unit_bug
