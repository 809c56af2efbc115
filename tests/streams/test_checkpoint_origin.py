"""What a checkpoint describes, recorded and checked without a stack (``streams/checkpoint_origin.py``): a view's plan
identity follows what its window state means and nothing else, and a checkpoint of another plan is refused in one
line naming the views and the command that rebuilds them. The refusal through `loopline stream submit` against a real
stack is in test_flink_job.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from feature_store.config import repo_stream_views
from streams.checkpoint_origin import check_origin, record_origin, recorded_plan
from streams.feature_plan import FeaturePlan, ViewPlan, compile_plan
from streams.job_settings import JobStateError
from tests.support.templates import FRAUD

FRESH = "loopline stream submit --no-restore"


@pytest.fixture(scope="module")
def plan() -> FeaturePlan:
    return compile_plan(repo_stream_views(FRAUD.feature_repo), FRAUD)


def _windowed(view: ViewPlan, function: str | None = None) -> int:
    """The position of the view's first windowed aggregation (of ``function``, when given)."""
    return next(i for i, a in enumerate(view.aggregations) if a.window_ms is not None and function in (None, a.function))


def _with_aggregation(view: ViewPlan, index: int | None = None, **change: object) -> ViewPlan:
    """``view`` with its aggregation at ``index`` (default: the first windowed one) changed."""
    index = _windowed(view) if index is None else index
    aggregations = list(view.aggregations)
    aggregations[index] = dataclasses.replace(aggregations[index], **change)
    return dataclasses.replace(view, aggregations=tuple(aggregations))


def _with_column_type(plan: FeaturePlan, topic: str, column: str, type_: str) -> FeaturePlan:
    """``plan`` with ``column`` of ``topic``'s contract declared as ``type_``."""
    source = plan.source(topic)
    fields = tuple(dataclasses.replace(f, type=type_) if f.name == column else f for f in source.contract.fields)
    changed = dataclasses.replace(source, contract=dataclasses.replace(source.contract, fields=fields))
    return dataclasses.replace(plan, sources=tuple(changed if s is source else s for s in plan.sources))


def test_a_views_identity_follows_what_its_window_state_means(plan: FeaturePlan) -> None:
    view = next(v for v in plan.views if any(a.function == "count_distinct" for a in v.aggregations))
    aggregation = view.aggregations[_windowed(view)]
    distinct = view.aggregations[_windowed(view, "count_distinct")]
    moved = plan.reading({view.topic: "events.elsewhere"})
    changed = {
        "a widened window": plan.identity(_with_aggregation(view, window_ms=aggregation.window_ms * 2)),
        "another slide": plan.identity(_with_aggregation(view, slide_ms=aggregation.slide_ms // 2)),
        "a replaced column": plan.identity(_with_aggregation(view, column="another_column")),
        "another function": plan.identity(_with_aggregation(view, function="max" if aggregation.function != "max" else "min")),
        "aggregations reordered": plan.identity(dataclasses.replace(view, aggregations=view.aggregations[::-1])),
        "more keys": plan.identity(dataclasses.replace(view, entity_keys=(*view.entity_keys, "country"))),
        "another topic": moved.identity(dataclasses.replace(view, topic="events.elsewhere")),
        "a distinct column's values now numbers": _with_column_type(plan, view.topic, distinct.column, "long").identity(view),
    }
    for what, identity in changed.items():
        assert identity != plan.identity(view), what
    same = {
        "a renamed feature": _with_aggregation(view, name="renamed"),
        "more lateness": dataclasses.replace(view, out_of_orderness_ms=view.out_of_orderness_ms + 1),
        "another offline path": dataclasses.replace(view, offline_path="/elsewhere"),
    }
    for what, other in same.items():
        assert plan.identity(other) == plan.identity(view), f"{what}: the state kept by position means the same"
    renamed, later = same["a renamed feature"], same["more lateness"]
    assert plan.rows_identity(renamed) != plan.rows_identity(view), "rows keep values under the names: a rename rebuilds them"
    assert plan.rows_identity(later) == plan.rows_identity(view), "lateness changes neither state nor rows"
    assert plan.source(view.topic).contract.field(distinct.column).type == "string"
    as_enum = _with_column_type(plan, view.topic, distinct.column, "enum")
    assert as_enum.identity(view) == plan.identity(view), "an enum reaches the state as the same strings"


def test_a_checkpoint_of_another_plan_is_refused_naming_the_views(plan: FeaturePlan, tmp_path: Path) -> None:
    run, checkpoint = tmp_path / "job-1", tmp_path / "job-1" / "chk-7"
    checkpoint.mkdir(parents=True)
    view = plan.views[0]
    wider = _with_aggregation(view, window_ms=view.aggregations[_windowed(view)].window_ms * 2)
    before = {**plan.identities(), view.name: plan.identity(wider), "retired_view": "0123456789ab"}
    now = {**plan.identities(), "new_view": "ba9876543210"}
    record_origin(run, "cluster-a", before)
    assert recorded_plan(str(checkpoint)) == before, "a chk-N folder reads its job run's record"

    check_origin(str(checkpoint), "cluster-a", FRESH, before)  # the same plan restores
    check_origin(str(checkpoint), "cluster-a", FRESH)  # a job without a plan (the joiner) is not asked
    with pytest.raises(JobStateError) as refused:
        check_origin(str(checkpoint), "cluster-a", FRESH, now)
    line = str(refused.value)
    assert "\n" not in line and f"`{FRESH}`" in line, line
    assert f"changed: {view.name}" in line and "added: new_view" in line and "removed: retired_view" in line, line

    record_origin(tmp_path / "job-0", "cluster-a")  # written before plans were recorded: passes, as origins do
    (tmp_path / "job-0" / "chk-1").mkdir()
    assert recorded_plan(str(tmp_path / "job-0" / "chk-1")) is None
    check_origin(str(tmp_path / "job-0" / "chk-1"), "cluster-a", FRESH, now)
