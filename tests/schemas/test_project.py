"""A project file Loopline cannot take is refused when the project loads, naming the file, the entry and what is
wrong: each case is the delivery template with one thing broken."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from loopline.project import template_path
from schemas.project import PROJECT_FILE, ProjectError, load_project


def _edit_file(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(project: Path) -> None:
        spec = yaml.safe_load((project / PROJECT_FILE).read_text())
        change(spec)
        (project / PROJECT_FILE).write_text(yaml.safe_dump(spec))

    return edit


def _edit_contract(name: str, field: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(project: Path) -> None:
        path = project / "contracts" / name
        schema = json.loads(path.read_text())
        change(next(f for f in schema["fields"] if f["name"] == field))
        path.write_text(json.dumps(schema))

    return edit


CASES = {
    "labels from a topic it does not declare": (
        _edit_file(lambda s: s["labels"].update(topic="events.returns")),
        "labels.topic names 'events.returns'",
    ),
    "a numeric label that is text": (
        _edit_file(lambda s: s["labels"].update(value="courier_id")),
        "is a string, not a int or long or float or double",
    ),
    "a binary label over a number": (_edit_file(lambda s: s["labels"].update(kind="binary")), "not a boolean"),
    "a label joined on a field that may be null": (
        _edit_contract("delivery.avsc", "order_id", lambda f: f.update(type=["null", "string"], default=None)),
        "labels.joins_on: field 'order_id'",
    ),
    "a message key that may be null": (
        _edit_contract("order.avsc", "restaurant_id", lambda f: f.update(type=["null", "string"], default=None)),
        "may be null",
    ),
    "a duration without a unit": (_edit_file(lambda s: s["labels"].update(horizon="3 weeks")), "is not a duration"),
    "a request input the scored event cannot backfill": (
        _edit_file(lambda s: s["scored_event"]["request_fields"].pop("cuisine")),
        "['request:cuisine'] are request fields",
    ),
    "a key the contract lacks": (_edit_file(lambda s: s["topics"]["events.orders"].update(key="shop_id")), "key names 'shop_id'"),
    "skew thresholds for a feature the model does not take": (
        _edit_file(lambda s: s["monitoring"]["skew_thresholds"].update({"zone_features:zone_orders_1h": {"psi_alert": 1.0}})),
        "monitoring.skew_thresholds names zone_features:zone_orders_1h",
    ),
    "an unknown entry": (_edit_file(lambda s: s.update(modle={})), "modle"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_project_is_refused_naming_what_is_wrong(case: str, tmp_path: Path) -> None:
    edit, words = CASES[case]
    project = tmp_path / "delivery"
    shutil.copytree(template_path("delivery"), project, ignore=shutil.ignore_patterns("__pycache__", "data"))
    load_project(project)  # the template as shipped loads
    edit(project)
    with pytest.raises(ProjectError) as refused:
        load_project(project)
    assert words in str(refused.value) and PROJECT_FILE in str(refused.value), str(refused.value)
