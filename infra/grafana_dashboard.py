"""The Grafana dashboard for teams that run Grafana: the skew alert dashboard's panels over the same Prometheus metrics,
generated from code into ``infra/grafana/dashboards/loopline-skew.json`` (Grafana's provisioning files beside it).

    python -m infra.grafana_dashboard      # rewrites the JSON; tests/infra/test_grafana_dashboard.py checks it is current
"""

from __future__ import annotations

import json
from pathlib import Path

GRAFANA_DIR = Path(__file__).parent / "grafana"
DASHBOARD_FILE = GRAFANA_DIR / "dashboards" / "loopline-skew.json"
DATASOURCE = {"type": "prometheus", "uid": "loopline-prometheus"}

#: (title, unit, [(PromQL, legend)], width): the panels, top to bottom, two to a row unless 24 wide.
PANELS = [
    ("Firing and pending alerts", "none", [('ALERTS{alertname=~"Loopline.*"}', "{{alertname}} {{alertstate}} {{feature}}")], 24),
    ("PSI by feature (against the training snapshot)", "none", [("loopline_feature_psi", "{{feature}} v{{model_version}}")], 12),
    ("PSI alert threshold", "none", [('loopline_feature_skew_threshold{measure="psi_alert"}', "{{feature}}")], 12),
    ("Jensen-Shannon divergence (numeric)", "none", [("loopline_feature_js_divergence", "{{feature}} v{{model_version}}")], 12),
    ("L-infinity distance (categorical)", "none", [("loopline_feature_linf_distance", "{{feature}} v{{model_version}}")], 12),
    (
        "Online vs offline recompute: value mismatch",
        "percentunit",
        [
            ("loopline_feature_consistency_mismatch_ratio", "{{feature}} mismatch"),
            ("loopline_feature_consistency_lag_ratio", "{{feature}} lag"),
            ("loopline_feature_consistency_ahead_ratio", "{{feature}} ahead"),
        ],
        12,
    ),
    ("Defaulted feature rate", "percentunit", [("loopline_feature_defaulted_ratio", "{{feature}} v{{model_version}}")], 12),
    (
        "Scorer p99 latency",
        "s",
        [
            (
                "histogram_quantile(0.99, sum by (le, instance) "
                '(rate(loopline_scoring_stage_seconds_bucket{stage="total"}[5m])))',
                "{{instance}} p99",
            )
        ],
        12,
    ),
    (
        "Requests by model version and outcome",
        "reqps",
        [
            (
                "sum by (alias, version, outcome) (rate(loopline_scoring_model_requests_total[5m]))",
                "{{alias}} v{{version}} {{outcome}}",
            )
        ],
        12,
    ),
    ("Feature job freshness (emit lag)", "ms", [("max(flink_taskmanager_job_task_operator_currentEmitEventTimeLag)", "lag")], 12),
    ("Feature job consumer lag", "none", [("sum(flink_taskmanager_job_task_operator_pendingRecords)", "pending records")], 12),
    (
        "Feature view lag (progress behind the clock, as scorers read it)",
        "s",
        [("max by (view) (loopline_feature_view_lag_seconds)", "{{view}}")],
        12,
    ),
    (
        "Stale features served (read as of a lagging job's progress)",
        "ops",
        [("sum by (instance) (rate(loopline_scoring_stale_features_total[5m]))", "{{instance}}")],
        12,
    ),
]


def dashboard() -> dict:
    """The dashboard as Grafana's JSON model."""
    panels, x, y = [], 0, 0
    for index, (title, unit, targets, width) in enumerate(PANELS, start=1):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(
            {
                "id": index,
                "type": "timeseries",
                "title": title,
                "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        x += width
    return {
        "uid": "loopline-skew",
        "title": "Loopline — feature skew and consistency",
        "schemaVersion": 39,
        "version": 1,
        "tags": ["loopline"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "panels": panels,
    }


def render() -> str:
    """The dashboard file's text."""
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    DASHBOARD_FILE.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_FILE.write_text(render())
    print(f"wrote {DASHBOARD_FILE}")


if __name__ == "__main__":
    main()
