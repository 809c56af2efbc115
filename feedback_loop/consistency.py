"""Row-level online/offline consistency: the features a scorer used, against the offline recompute point in time.

For each logged request of the sample, each streaming feature it used is recomputed from the raw event log as
of the request's time (``streams/recompute.py``, the job's window semantics written independently) and compared
with the value the scorer logged:

* **match**: equal (exactly; means within a relative 1e-9, one division of exact sums: ``same_feature_value``);
* **lag**: different, but explained by the online row being behind: the row the scorer read equals the recompute
  over the events behind it — exactly those, when the row names the log positions it absorbed (each partition's last
  offset, logged with the request: an entity whose events spread over partitions, e.g. one that is not the topic's
  key, has no single log order); else a prefix of the entity's events in log order (one partition) with the row's
  logged event time, all of which had reached Kafka before the request was scored. The job had not applied the rest
  yet, out-of-order events included. Streaming always lags a little; this is freshness, not a bug;
* **ahead**: different, but the online row is such a prefix's row *newer* than the request's time: an event stamped
  after the request (the event producer's clock ahead of the requester's) was already in Kafka and applied when it
  was scored. Clocks, not a bug either; a steady share says the clocks disagree;
* **value**: different, and explained by neither: the online path computes the feature differently;
* **missing**: the scorer had no value (it used the default) where the log has events before the request;
* **extra**: the scorer had a value where the log has no event before the request, and none the log explains.

Requests are sampled by a hash of the entity key, so a sampled key is followed over time and its whole history
is in the replay. SMAPE (symmetric mean absolute percentage error, 0–2) of the compared numbers says how far off
the mismatches are.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from schemas.records import PredictionRecord
from streams.feature_plan import FeaturePlan, ViewPlan
from streams.recompute import LATEST_EVENT, recompute, same_feature_value

#: Outcomes of one comparison.
OUTCOMES = ("match", "lag", "ahead", "value", "missing", "extra")


def sampled(entity: Hashable, rate: float) -> bool:
    """Whether requests for ``entity`` (a join key's value, or a tuple of several) are in the consistency sample: a
    stable hash of the key below ``rate``."""
    if rate >= 1:
        return True
    text = "\0".join(entity) if isinstance(entity, tuple) else str(entity)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2**64


@dataclass
class FeatureConsistency:
    """One feature's outcomes over the compared requests, and the SMAPE of the value pairs compared."""

    feature: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    smape_sum: float = 0.0
    smape_pairs: int = 0

    @property
    def compared(self) -> int:
        """Comparisons of this feature, all outcomes."""
        return sum(self.counts.values())

    def rate(self, outcome: str) -> float:
        """The share of compared requests with ``outcome`` (0 before any)."""
        return self.counts[outcome] / self.compared if self.compared else 0.0

    @property
    def mismatch_ratio(self) -> float:
        """Value mismatches per compared request: the online path computing the feature differently."""
        return self.rate("value")

    @property
    def smape(self) -> float | None:
        """The mean SMAPE of the compared value pairs (None before any)."""
        return self.smape_sum / self.smape_pairs if self.smape_pairs else None


def _smape(a: float, b: float) -> float:
    denominator = abs(a) + abs(b)
    return 0.0 if denominator == 0 else 2 * abs(a - b) / denominator


def features_at(view: ViewPlan, events: pd.DataFrame, at: pd.DataFrame) -> dict[tuple[Hashable, int], dict]:
    """Recomputed features of ``view`` read at the ``(<entity key>, at_ms)`` points of ``at`` (windows as of ``at_ms``),
    by (entity, at_ms), each with the event time of the latest event they count (``LATEST_EVENT``) and ``at_ms``;
    points before an entity's first event are left out."""
    if at["at_ms"].isna().any() or events[view.time_field].isna().any():
        raise ValueError("features_at needs a time for every point and every event")
    at = at.drop_duplicates().astype({"at_ms": "int64"})
    rows = recompute(view, events.astype({view.time_field: "int64"}), at)
    records = [
        dict(zip(rows.columns, values, strict=True))
        for values in zip(*(rows[name].tolist() for name in rows.columns), strict=True)
    ]
    return {(record[view.entity_key], int(record["at_ms"])): record for record in records}


def events_needed_since(plan: FeaturePlan, requests: Sequence[PredictionRecord], features: Iterable[str]) -> int | None:
    """The earliest event time ``check_consistency`` of ``requests`` on ``features`` needs from the log (a reader of the
    log may let older events go); None when the requests carry none of them (only windowed features count:
    ``FeaturePlan.history_ms`` passes over the others).

    Each value is checked against the recompute as of a row: the entity's latest event at or before the request; for
    a value that differs, also the rows the scorer could have read at its logged row time (prefixes, in log order, of
    the entity's events that had all reached Kafka when it was scored). A row at time T counts the events from T less
    the longest window the requests carry and its slide; older events change neither its values nor which prefixes
    are candidates (they are older than T, a candidate's latest). So the earliest of the requests' times and their
    logged row times, less that history, bounds what every logged row needs, and every latest event at least as
    recent. The out-of-orderness is taken off too, so that a read starting by Kafka timestamp (the send time) finds
    events stamped up to that much after they were sent. Not bounded, so judged without its older events: an entity's
    latest event before its request when it is older than that earliest time and the scorer read no row of the
    entity, or one newer than the request."""
    wanted = set(features)
    history = plan.history_ms(name for record in requests for name in record.features if name in wanted)
    if not history:
        return None
    earliest = min(
        min([record.requested_at_ms, *record.feature_row_times_ms.values(), *record.feature_read_as_of_ms.values()])
        for record in requests
    )
    return earliest - history - plan.out_of_orderness_ms


def read_time(record: PredictionRecord, view: str) -> int:
    """When the scorer read ``view``'s windows for ``record``: at the request's time, or as of the view's progress where
    its job lagged (``feature_read_as_of_ms``: the features stale), which the recompute then reads at too."""
    return record.feature_read_as_of_ms.get(view, record.requested_at_ms)


def check_consistency(
    plan: FeaturePlan,
    events: Mapping[str, pd.DataFrame],
    requests: Iterable[PredictionRecord],
    sample_rate: float = 1.0,
    features: Sequence[str] | None = None,
) -> dict[str, FeatureConsistency]:
    """Compare the streaming features of ``requests`` (those whose entity is sampled at ``sample_rate``) with the
    recompute over ``events`` (the accepted events of the log, by topic); per ``view:feature`` name, its outcomes.
    ``features`` limits the check to those names (default: every streaming feature the requests logged)."""
    requests = list(requests)
    report: dict[str, FeatureConsistency] = {}
    for view in plan.views:
        names = [f"{view.name}:{f}" for f in view.feature_names if features is None or f"{view.name}:{f}" in features]
        chosen = [
            r
            for r in requests
            if all(k in r.entity_keys for k in view.entity_keys)
            and sampled(view.entity(r.entity_keys), sample_rate)
            and any(name in r.features for name in names)
        ]
        if not chosen or view.topic not in events:
            continue
        view_events = view.with_entity(events[view.topic])
        keys = [view.entity(r.entity_keys) for r in chosen]
        row_times = [r.feature_row_times_ms.get(view.name) for r in chosen]
        at = pd.DataFrame({view.entity_key: pd.Series(keys, dtype=object), "at_ms": [read_time(r, view.name) for r in chosen]})
        lookup = features_at(view, view_events, at)
        # Only a value that differs needs the recompute as of its row (to tell lag from a wrong value).
        differing = [
            (record, key, row_time)
            for record, key, row_time in zip(chosen, keys, row_times, strict=True)
            if row_time is not None and _differs(record, names, lookup.get((key, read_time(record, view.name))))
        ]
        positioned = {"partition", "offset"} <= set(view_events.columns)
        exact, prefixed = [], []
        for d in differing:
            (exact if positioned and view.name in d[0].feature_row_absorbed else prefixed).append(d)
        as_of_rows = {**_as_of_rows(view, view_events, prefixed), **_absorbed_rows(view, view_events, exact)}
        for record, key in zip(chosen, keys, strict=True):
            offline = lookup.get((key, read_time(record, view.name)))
            as_of_row = as_of_rows.get(record.request_id, [])
            for name in names:
                if name not in record.features:
                    continue
                feature = name.split(":", 1)[1]
                consistency = report.get(name) or report.setdefault(name, FeatureConsistency(name))  # not one built per value
                online = None if name in record.defaulted_features else record.features[name]
                want = None if offline is None else offline[feature]
                consistency.counts[_outcome(feature, want, online, offline, as_of_row)] += 1
                if not isinstance(online, str) and not pd.isna(online) and not pd.isna(want):
                    consistency.smape_sum += _smape(float(want), float(online))
                    consistency.smape_pairs += 1
    return report


def _as_of_rows(
    view: ViewPlan, events: pd.DataFrame, differing: list[tuple[PredictionRecord, Hashable, int]]
) -> dict[str, list[dict]]:
    """Per request id, what a read at the request's time returns from each row the online store could have held for
    its entity with the logged row time: the job applies an entity's events in log order (one partition), so a row is
    a prefix of them, read with its windows as of the request's time (or the prefix's latest event, if later).
    Candidates are the prefixes whose latest time is the row's and whose events had all reached Kafka before the
    request was scored (``kafka_ms``, ``offset``: an event produced out of order, older than the row, may not have been
    in it yet). Events without log positions give the one row of the events up to that time."""
    if not differing:
        return {}
    if not {"kafka_ms", "offset"} <= set(events.columns):
        return _rows_up_to_row_time(view, events, differing)
    key_column = view.entity_key
    logged = events[events[key_column].isin({key for _, key, _ in differing})].sort_values("offset", kind="stable")
    times, kafka_ms = logged[view.time_field].to_numpy(), logged["kafka_ms"].to_numpy()
    positions = logged.groupby(key_column, sort=False).indices  # per entity, its events in log order
    row_times = {key: np.maximum.accumulate(times[where]) for key, where in positions.items()}
    reached = {key: np.maximum.accumulate(kafka_ms[where]) for key, where in positions.items()}  # all of a prefix in Kafka by
    prefixes: dict[tuple[Hashable, int], int] = {}  # (entity, events in the prefix): the prefix's number
    read_times: dict[tuple[Hashable, int], set[int]] = {}  # the times each prefix is read at
    candidates: dict[str, list[tuple[tuple[Hashable, int], int]]] = {}  # per request, its candidate prefixes and read time
    for record, key, row_time in differing:
        if key in positions:
            ends = np.flatnonzero((row_times[key] == row_time) & (reached[key] <= record.scored_at_ms)) + 1
            read_at = max(read_time(record, view.name), row_time)
            candidates[record.request_id] = [((key, end), read_at) for end in ends.tolist()]
            for prefix, _ in candidates[record.request_id]:
                prefixes.setdefault(prefix, len(prefixes))
                read_times.setdefault(prefix, set()).add(read_at)
    used = list(dict.fromkeys([key_column, view.time_field, *(agg.column for agg in view.aggregations)]))
    as_of: dict[tuple[tuple[str, int], int], dict] = {}
    for batch in _prefix_batches(view, prefixes, positions, row_times, times):
        # Every prefix of the batch as an entity of its own (keyed by its number), so that one recompute evaluates
        # them all, at each time it is read (none before its latest event); each row stands for its real entity.
        numbered = [(prefix, prefixes[prefix], where) for prefix, where in batch]
        points = [(prefix, number, at) for prefix, number, _ in numbered for at in sorted(read_times[prefix])]
        frame = (
            logged[used]
            .iloc[np.concatenate([where for _, _, where in numbered])]
            .assign(**{key_column: np.repeat([number for _, number, _ in numbered], [len(where) for _, _, where in numbered])})
        )
        rows = features_at(
            view, frame, pd.DataFrame({key_column: [n for _, n, _ in points], "at_ms": [at for _, _, at in points]})
        )
        as_of |= {(prefix, at): {**rows[(number, at)], key_column: prefix[0]} for prefix, number, at in points}
    return {request_id: [as_of[point] for point in points] for request_id, points in candidates.items()}


def _absorbed_rows(
    view: ViewPlan, events: pd.DataFrame, differing: list[tuple[PredictionRecord, Hashable, int]]
) -> dict[str, list[dict]]:
    """Per request id whose row named the log positions it absorbed (``feature_row_absorbed``): the one row of exactly
    those events of its entity (each partition's up to its offset, however the entity's events spread over
    partitions), read at the request's time (or the row's, if later). One recompute evaluates them all."""
    if not differing:
        return {}
    key_column = view.entity_key
    positions = events.groupby(key_column, sort=False).indices
    partitions, offsets = events["partition"].to_numpy(), events["offset"].to_numpy()
    rows: dict[tuple[Hashable, str], int] = {}
    parts, points = [], {}
    for record, key, row_time in differing:
        absorbed = record.feature_row_absorbed[view.name]
        where = positions.get(key)
        if where is None:
            continue
        number = rows.get((key, absorbed))
        if number is None:
            number = rows[(key, absorbed)] = len(rows)
            last = dict(_absorbed_positions(absorbed))
            limit = np.array([last.get(int(p), -1) for p in partitions[where]])
            parts.append((number, where[offsets[where] <= limit]))
        points[record.request_id] = (key, number, max(read_time(record, view.name), row_time))
    parts = [(number, where) for number, where in parts if len(where)]
    if not parts:
        return {}
    frame = events.iloc[np.concatenate([where for _, where in parts])].assign(
        **{key_column: np.repeat([number for number, _ in parts], [len(where) for _, where in parts])}
    )
    read = features_at(
        view, frame, pd.DataFrame({key_column: [n for _, n, _ in points.values()], "at_ms": [at for *_, at in points.values()]})
    )
    return {request_id: [{**read[(n, at)], key_column: key}] for request_id, (key, n, at) in points.items() if (n, at) in read}


def _absorbed_positions(text: str) -> Iterator[tuple[int, int]]:
    """``partition:offset,...`` as (partition, offset) pairs."""
    for pair in filter(None, text.split(",")):
        partition, _, offset = pair.partition(":")
        yield int(partition), int(offset)


def _rows_up_to_row_time(
    view: ViewPlan, events: pd.DataFrame, differing: list[tuple[PredictionRecord, Hashable, int]]
) -> dict[str, list[dict]]:
    """:func:`_as_of_rows` for events without log positions: per request id, the one row of its entity's events up to
    the logged row time, read at the request's time (or the row time, if later). One recompute evaluates them all,
    each (entity, row time) as an entity of its own."""
    key_column = view.entity_key
    numbers = {row: n for n, row in enumerate(dict.fromkeys((key, row_time) for _, key, row_time in differing))}
    positions, times = events.groupby(key_column, sort=False).indices, events[view.time_field].to_numpy()
    parts = [
        (n, where[times[where] <= row_time])
        for (key, row_time), n in numbers.items()
        if (where := positions.get(key)) is not None
    ]
    if not parts:
        return {}
    frame = events.iloc[np.concatenate([where for _, where in parts])].assign(
        **{key_column: np.repeat([n for n, _ in parts], [len(where) for _, where in parts])}
    )
    points = {
        record.request_id: (key, numbers[(key, row_time)], max(read_time(record, view.name), row_time))
        for record, key, row_time in differing
    }
    rows = features_at(
        view, frame, pd.DataFrame({key_column: [n for _, n, _ in points.values()], "at_ms": [at for *_, at in points.values()]})
    )
    return {request_id: [{**rows[(n, at)], key_column: key}] for request_id, (key, n, at) in points.items() if (n, at) in rows}


#: Events recomputed at once when the candidate rows are evaluated: bounds the replay's memory.
_BATCH_EVENTS = 500_000


def _prefix_batches(
    view: ViewPlan,
    prefixes: Mapping[tuple[str, int], int],
    positions: Mapping[str, np.ndarray],
    row_times: Mapping[str, np.ndarray],
    times: np.ndarray,
) -> Iterator[list[tuple[tuple[str, int], np.ndarray]]]:
    """The prefixes with the events their row needs (indices into the log), in batches of about ``_BATCH_EVENTS``.

    A row as of time T needs only the prefix's events inside its longest window (from T - window - slide) and the
    latest one before that (for the time since the previous event): not the whole history, which a busy entity's
    every candidate prefix would repeat."""
    lookback = max((agg.window_ms + agg.slide_ms for agg in view.aggregations if agg.window_ms is not None), default=0)
    batch: list[tuple[tuple[str, int], np.ndarray]] = []
    size = 0
    for key, end in prefixes:
        where = positions[key][:end]
        recent = times[where] >= row_times[key][end - 1] - lookback
        before = where[~recent]
        needed = where[recent] if not len(before) else np.concatenate([before[[np.argmax(times[before])]], where[recent]])
        batch.append(((key, end), needed))
        size += len(needed)
        if size >= _BATCH_EVENTS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _differs(record: PredictionRecord, names: Sequence[str], offline: dict | None) -> bool:
    """Whether any of ``names`` the record logged differs from the recompute ``offline`` (missing counts as differing)."""
    for name in names:
        logged = name in record.features and name not in record.defaulted_features
        if logged and (
            offline is None
            or not same_feature_value(name.split(":", 1)[1], offline[name.split(":", 1)[1]], record.features[name])
        ):
            return True
    return False


def _outcome(feature: str, want: object, online: object, offline: dict | None, as_of_row: list[dict]) -> str:
    """One comparison's outcome (see the module docstring): ``as_of_row`` holds the rows the log explains the online
    value by, if it differs."""
    if online is None:
        return "match" if offline is None else "missing"
    if offline is not None and same_feature_value(feature, want, online):
        return "match"
    explaining = [row[LATEST_EVENT] for row in as_of_row if same_feature_value(feature, row[feature], online)]
    if offline is not None and any(time <= offline[LATEST_EVENT] for time in explaining):
        return "lag"
    if explaining:
        return "ahead"
    return "extra" if offline is None else "value"


def summary(report: dict[str, FeatureConsistency]) -> dict[str, dict[str, float | int | None]]:
    """Per feature: requests compared, mismatch / lag / ahead / missing / extra ratios and SMAPE (for tables and JSON)."""
    return {
        name: {
            "compared": c.compared,
            "mismatch_ratio": c.mismatch_ratio,
            "lag_ratio": c.rate("lag"),
            "ahead_ratio": c.rate("ahead"),
            "missing_ratio": c.rate("missing"),
            "extra_ratio": c.rate("extra"),
            "smape": c.smape,
        }
        for name, c in sorted(report.items())
    }


def by_outcome(report: dict[str, FeatureConsistency]) -> dict[str, int]:
    """Comparisons of every feature, by outcome."""
    totals: dict[str, int] = defaultdict(int)
    for consistency in report.values():
        for outcome, count in consistency.counts.items():
            totals[outcome] += count
    return dict(totals)
