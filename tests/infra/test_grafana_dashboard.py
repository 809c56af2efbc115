"""The Grafana dashboard and its provisioning: generated from code and current, on metrics Loopline exports."""

from __future__ import annotations

import re

import yaml
from prometheus_client import generate_latest

from feedback_loop.monitor_metrics import MonitorMetrics
from infra.grafana_dashboard import DASHBOARD_FILE, DATASOURCE, GRAFANA_DIR, dashboard, render
from online.metrics import ScorerMetrics
from tests.support.flink_metrics import FLINK_METRICS


def test_the_checked_in_dashboard_is_what_the_code_generates() -> None:
    assert DASHBOARD_FILE.read_text() == render(), "run: python -m infra.grafana_dashboard"


def test_every_panel_queries_metrics_that_exist_through_the_provisioned_datasource() -> None:
    exported = (
        generate_latest(ScorerMetrics().collector_registry).decode()
        + generate_latest(MonitorMetrics().collector_registry).decode()
    )
    types = set(re.findall(r"^# TYPE (\S+) ", exported, re.M))
    panels = dashboard()["panels"]
    expressions = [target["expr"] for panel in panels for target in panel["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for expr in expressions for name in re.findall(r"loopline_\w+", expr)}
    assert used and used <= types, used - types
    assert {name for expr in expressions for name in re.findall(r"flink_\w+", expr)} <= FLINK_METRICS
    # Every monitor metric is on the dashboard (a new one is not forgotten).
    monitor = {
        name
        for name in re.findall(
            r"^# TYPE (loopline_feature_\S+) ", generate_latest(MonitorMetrics().collector_registry).decode(), re.M
        )
    }
    assert monitor - used <= {
        "loopline_feature_window_rows",
        "loopline_feature_missing_ratio",
        "loopline_feature_consistency_extra_ratio",
        "loopline_feature_consistency_missing_ratio",
        "loopline_feature_consistency_smape",
        "loopline_feature_consistency_comparisons_total",
    }
    datasources = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "loopline.yml").read_text())["datasources"]
    assert {d["uid"] for d in datasources} == {DATASOURCE["uid"]}
    assert all(panel["datasource"] == DATASOURCE for panel in panels)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)) and all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)
