"""What a checkpoint describes, recorded and checked without a stack (``streams/checkpoint_origin.py``): a view's plan
identity follows what its window state means and nothing else, and a checkpoint of another plan is refused in one
line naming the views and the command that rebuilds them. The refusal through `loopline stream submit` against a real
stack is in test_stale_checkpoint.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from templates import FRAUD

from feature_store.config import repo_stream_views
from streams.checkpoint_origin import check_origin, record_origin, recorded_plan
from streams.feature_plan import FeaturePlan, ViewPlan, compile_plan
from streams.job_settings import JobStateError

FRESH = "loopline stream submit --no-restore"


@pytest.fixture(scope="module")
def plan() -> FeaturePlan:
    return compile_plan(repo_stream_views(FRAUD.feature_repo), FRAUD)


def _windowed(view: ViewPlan) -> int:
    return next(i for i, a in enumerate(view.aggregations) if a.window_ms is not None)


def _with_aggregation(view: ViewPlan, **change: object) -> ViewPlan:
    index = _windowed(view)
    aggregations = list(view.aggregations)
    aggregations[index] = dataclasses.replace(aggregations[index], **change)
    return dataclasses.replace(view, aggregations=tuple(aggregations))


def test_a_views_identity_follows_what_its_window_state_means(plan: FeaturePlan) -> None:
    view = plan.views[0]
    aggregation = view.aggregations[_windowed(view)]
    changed = {
        "a widened window": _with_aggregation(view, window_ms=aggregation.window_ms * 2),
        "another slide": _with_aggregation(view, slide_ms=aggregation.slide_ms // 2),
        "a replaced column": _with_aggregation(view, column="another_column"),
        "another function": _with_aggregation(view, function="max" if aggregation.function != "max" else "min"),
        "more keys": dataclasses.replace(view, entity_keys=(*view.entity_keys, "country")),
        "another topic": dataclasses.replace(view, topic="events.other"),
        "more lateness": dataclasses.replace(view, out_of_orderness_ms=view.out_of_orderness_ms + 1),
    }
    for what, other in changed.items():
        assert other.identity != view.identity, what
    same = dataclasses.replace(view, offline_path="/elsewhere", value_types={})
    assert same.identity == view.identity, "where rows are logged offline is not what the state means"
    assert len(set(plan.identities().values())) == len(plan.views), "each view has its own identity"


def test_a_checkpoint_of_another_plan_is_refused_naming_the_views(plan: FeaturePlan, tmp_path: Path) -> None:
    run, checkpoint = tmp_path / "job-1", tmp_path / "job-1" / "chk-7"
    checkpoint.mkdir(parents=True)
    view = plan.views[0]
    before = {**plan.identities(), view.name: _with_aggregation(view, window_ms=view.aggregations[_windowed(view)].window_ms * 2).identity,
              "retired_view": "0123456789ab"}  # fmt: skip
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
