"""Features added since a snapshot was taken, backfilled into it: for each of its predictions, the feature as of the
request's time, recomputed from the retained events with the job's window semantics (``streams/recompute.py``), so a
model can train today on a feature added today.

A snapshot holds each example's event and request ids, not its entities or its request time: those come from the
example log it was taken from (``training.examples``: each example's entity keys and ``requested_at_ms``), matched by
(event id, request id). The windows are read as of ``requested_at_ms``, as the scorer reads them from the job's rows.
The result is the snapshot's rows with one column more per feature added: a new snapshot, content-addressed like any
other, whose manifest names the one it extends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from feedback_loop.consistency import features_at
from feedback_loop.snapshots import SnapshotError
from schemas.records import TrainingExample
from streams.feature_plan import FeaturePlan, ViewPlan


def requested_features(plan: FeaturePlan, frame: pd.DataFrame, features: Iterable[str]) -> list[tuple[ViewPlan, list[str]]]:
    """``features`` (``view:feature``) by the plan's view computing each; SnapshotError naming a feature no view
    computes, or one the snapshot already holds."""
    views = {view.name: view for view in plan.views}
    wanted: dict[str, list[str]] = {}
    for reference in features:
        name, _, feature = reference.partition(":")
        view = views.get(name)
        if view is None or feature not in view.feature_names:
            known = ", ".join(f"{v.name}:{f}" for v in plan.views for f in v.feature_names)
            raise SnapshotError(f"no stream feature view computes {reference!r} (the registry's: {known})")
        if reference in frame.columns:
            raise SnapshotError(f"the snapshot already holds {reference}: nothing to backfill")
        wanted.setdefault(name, []).append(reference)
    if not wanted:
        raise SnapshotError("name at least one feature to backfill (--feature view:feature)")
    return [(views[name], references) for name, references in wanted.items()]


def request_points(frame: pd.DataFrame, examples: Iterable[TrainingExample]) -> pd.DataFrame:
    """Per row of ``frame``, its example's entity keys (one column each) and ``requested_at_ms``, from ``examples``;
    SnapshotError when the log no longer holds some of the snapshot's examples."""
    logged = {(e.event_id, e.request_id): e for e in examples}
    found = [logged.get(key) for key in zip(frame["event_id"], frame["request_id"], strict=True)]
    missing = sum(example is None for example in found)
    if missing:
        raise SnapshotError(
            f"the example log no longer holds {missing} of the snapshot's {len(frame)} examples (their entities "
            "and request times): backfill needs the log the snapshot was taken from"
        )
    keys = sorted({key for example in found for key in example.entity_keys})
    points = {key: [example.entity_keys.get(key) for example in found] for key in keys}
    return pd.DataFrame({**points, "requested_at_ms": [example.requested_at_ms for example in found]}, index=frame.index)


def backfill_features(
    frame: pd.DataFrame,
    points: pd.DataFrame,
    wanted: Sequence[tuple[ViewPlan, list[str]]],
    events: Mapping[str, pd.DataFrame],
    defaults: Mapping[str, object],
    on_view: Callable[[ViewPlan], None] | None = None,
) -> pd.DataFrame:
    """``frame`` with a column per feature of ``wanted``: each row's value as of its ``requested_at_ms`` for its
    entity (``points``), recomputed over the accepted ``events`` of the view's topic; where that reads none (the entity
    had no event yet, an empty window) the feature's declared default (``defaults``: ``view:feature`` -> value or None),
    counted in the row's ``defaulted``, as the scorer would have used it. ``on_view`` is told of each view before it is
    recomputed."""
    added = frame.copy()
    defaulted = added["defaulted"].to_numpy(dtype=np.int64).copy()
    for view, references in wanted:
        if on_view is not None:
            on_view(view)
        absent = [key for key in view.entity_keys if key not in points.columns]
        if absent:
            raise SnapshotError(
                f"{view.name}'s entity ({', '.join(absent)}) is not among the examples' entity keys: its features "
                "cannot be read as of their requests"
            )
        at = view.with_entity(
            pd.DataFrame(
                {**{key: points[key].to_numpy() for key in view.entity_keys}, "at_ms": points["requested_at_ms"].to_numpy()}
            )
        )
        read = features_at(view, events[view.topic], at)
        for reference in references:
            feature = reference.split(":", 1)[1]
            values = [
                read.get((entity, int(at_ms)), {}).get(feature)
                for entity, at_ms in zip(at[view.entity_key], at["at_ms"], strict=True)
            ]
            missing = np.array([value is None or bool(pd.isna(value)) for value in values], dtype=bool)
            defaulted += missing
            added[reference] = [
                defaults.get(reference) if absent else value for value, absent in zip(values, missing.tolist(), strict=True)
            ]
    added["defaulted"] = defaulted
    return added
