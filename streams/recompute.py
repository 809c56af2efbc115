"""The offline recompute: the job's aggregations in batch over the raw event log, point in time.

This is what training sets and consistency checks use. It follows the window semantics of the
job's ``SlidingWindows`` operator (``streams/jvm``) but is written independently (pandas, sorted
arrays, binary search), so a test comparing the two really checks the streaming path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from streams.feature_plan import SCALE, FeaturePlan, ViewPlan

EVENT_TIME = "event_time_ms"


def split_late(events: pd.DataFrame, out_of_orderness_ms: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Reproduce the job's lateness verdicts from the log: ``(accepted, late)``.

    ``events`` needs ``partition`` and ``offset`` columns besides the record's. Within each
    partition, in offset order, an event is late when its time is more than the bound behind the
    newest event time seen before it in that partition (the job's per-partition watermark).
    """
    ordered = events.sort_values(["partition", "offset"], kind="stable")
    newest_before = ordered.groupby("partition")[EVENT_TIME].transform(lambda t: t.cummax().shift())
    late = ordered[EVENT_TIME] < newest_before - out_of_orderness_ms
    return ordered[~late], ordered[late]


def recompute(plan: ViewPlan, events: pd.DataFrame, at: pd.DataFrame | None = None) -> pd.DataFrame:
    """Features of ``plan`` for entities at points in time.

    ``events`` holds the accepted events (columns of the source record). ``at`` holds
    ``(<entity key>, at_ms)`` pairs; without it, each entity is evaluated at its latest event.
    Each row is what the online store held for that entity at ``at_ms`` (by event time):
    the features as of the entity's latest event at or before it. Pairs with no event before
    ``at_ms`` are left out. Columns: the entity key, ``event_time_ms`` (that latest event) and
    one per feature.
    """
    key = plan.entity_key
    if at is None:
        at = events.groupby(key, as_index=False)[EVENT_TIME].max().rename(columns={EVENT_TIME: "at_ms"})
    rows = []
    queries = at.groupby(key)["at_ms"]
    for entity, group in events.sort_values(EVENT_TIME, kind="stable").groupby(key, sort=False):
        if entity not in queries.groups:
            continue
        times = group[EVENT_TIME].to_numpy()
        # Each column once as a plain array: slicing a pandas column per point costs more than the aggregation.
        columns = {column: group[column].to_numpy() for column in {agg.column for agg in plan.aggregations if agg.column}}
        for at_ms in queries.get_group(entity):
            end = int(np.searchsorted(times, at_ms, side="right"))
            if end == 0:
                continue
            rows.append({key: entity, EVENT_TIME: int(times[end - 1]), **_features(plan, columns, times, end)})
    return pd.DataFrame(rows, columns=[key, EVENT_TIME, *plan.feature_names])


def _features(plan: ViewPlan, columns: dict[str, np.ndarray], times: np.ndarray, end: int) -> dict:
    latest = int(times[end - 1])
    values: dict = {}
    for agg in plan.aggregations:
        if agg.function == "time_since_previous":
            before = int(np.searchsorted(times, latest, side="left"))
            values[agg.name] = None if before == 0 else (latest - int(times[before - 1])) / 1000
            continue
        first_bucket = latest // agg.slide_ms - agg.window_buckets + 1
        start = int(np.searchsorted(times, first_bucket * agg.slide_ms, side="left"))
        window = columns[agg.column][start:end].tolist()
        values[agg.name] = _aggregate(agg.function, window)
    return values


def _aggregate(function: str, window: list) -> float | int | None:
    if function == "count":
        return len(window)
    if function == "count_distinct":
        return len(set(window))
    if not window:
        return None
    if function in ("sum", "mean"):
        total = sum(round(value * SCALE) for value in window)
        return total / SCALE if function == "sum" else total / len(window) / SCALE
    return max(window) if function == "max" else min(window)


def same_feature_value(feature: str, offline, online) -> bool:
    """Whether an online value equals the recompute's: exactly, except a mean within a relative 1e-9 (one division
    of exact sums); both missing counts as equal."""
    if pd.isna(offline) or online is None or pd.isna(online):
        return bool(pd.isna(offline)) and (online is None or bool(pd.isna(online)))
    return abs(offline - online) <= (1e-9 * abs(offline) if "mean" in feature else 0)


def feature_differences(
    plan: FeaturePlan, expected: dict[str, pd.DataFrame], read: Callable[[ViewPlan, pd.DataFrame], pd.DataFrame]
) -> list[str]:
    """Every (view, entity, feature) where ``read(view, expected frame)`` differs from the recompute in
    ``expected`` (by view): exact, except means within a relative 1e-9 (one division of exact sums)."""
    problems = []
    for view in plan.views:
        offline = expected[view.name]
        merged = offline.merge(read(view, offline), on=view.entity_key, suffixes=("_offline", "_online"))
        if len(merged) != len(offline):
            problems.append(f"{view.name}: {len(offline) - len(merged)} entities missing")
        for feature in view.feature_names:
            for entity, want, got in zip(merged[view.entity_key], merged[f"{feature}_offline"], merged[f"{feature}_online"]):
                if not same_feature_value(feature, want, got):
                    problems.append(f"{view.name}[{entity}].{feature}: online {got}, offline {want}")
    return problems


def accepted_events(plan: FeaturePlan, messages) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(accepted, late)`` events among a topic's Kafka ``messages``, as the job judges them: decoded by the
    contract, within the engine's range, not late for their partition; each with its partition, offset and the
    time it reached Kafka (``kafka_ms``)."""
    from schemas.records import TransactionEvent
    from schemas.validation import ContractViolation, decode

    valid = []
    for message in messages:
        try:
            event = decode(TransactionEvent, message.value() or b"").model_dump()
        except ContractViolation:
            continue
        if plan.out_of_range(event) is None:
            valid.append({**event, "partition": message.partition(), "offset": message.offset(), "kafka_ms": message.timestamp()[1]})
    return split_late(pd.DataFrame(valid), plan.out_of_orderness_ms)
