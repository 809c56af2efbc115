"""Prometheus alert rules (infra/prometheus/): valid, firing as their unit tests say — and staying quiet on healthy
series — on metrics Loopline's processes really export.

The scorer's rules have a hand-written promtool test file (tests/infra/alerts/). The monitoring rules' promtool tests are
written here from cases (series in, alerts out), each expected alert's runbook taken from the rule itself, so the
file promtool runs checks every rendered summary without copying the runbooks.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from feedback_loop.monitor_metrics import MonitorMetrics
from infra.prometheus_server import RULES_DIR
from online.metrics import ScorerMetrics
from tests.support.flink_metrics import FLINK_METRICS

REPO = Path(__file__).resolve().parents[2]
SCORING, MONITORING = RULES_DIR / "scoring.rules.yml", RULES_DIR / "monitoring.rules.yml"


def _promtool(*args: str, cwd: Path = REPO) -> None:
    result = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _rules(path: Path) -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]}


def test_scoring_rules_are_valid_and_fire_as_their_unit_tests_say() -> None:
    _promtool("check", "rules", str(SCORING))
    _promtool("test", "rules", "scoring_rules_test.yml", cwd=Path(__file__).with_name("alerts"))


def test_rules_only_use_metrics_loopline_exports() -> None:
    exported = (
        generate_latest(ScorerMetrics().collector_registry).decode()
        + generate_latest(MonitorMetrics().collector_registry).decode()
    )
    expressions = [rule["expr"] for path in RULES_DIR.glob("*.rules.yml") for rule in _rules(path).values()]
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for expr in expressions for name in re.findall(r"loopline_\w+", expr)}
    assert used and all(re.search(rf"^# TYPE {name} ", exported, re.M) for name in used), used - set(
        re.findall(r"# TYPE (\S+)", exported)
    )
    flink = {name for expr in expressions for name in re.findall(r"flink_\w+", expr)}
    assert flink == FLINK_METRICS
    # A refusal must be an increase for the alert to see it: its counters start at 0.
    assert (
        'loopline_scoring_model_refusals_total{reason="artifact"} 0.0'
        in generate_latest(ScorerMetrics().collector_registry).decode()
    )


def _threshold_series(feature: str, alert: float = 0.25, warn: float = 0.1) -> list[dict]:
    return [
        {"series": f'loopline_feature_skew_threshold{{feature="{feature}", measure="{measure}"}}', "values": f"{value}x40"}
        for measure, value in (("psi_warn", warn), ("psi_alert", alert), ("js_alert", 0.1), ("linf_alert", 0.1))
    ]


#: (name, input series, [(eval time, alert, [(labels, summary)])]): each alert's expected firing, none for quiet ones.
CASES = [
    (
        "a shifted feature pages, a healthy one and one under its own higher threshold stay quiet",
        [
            *_threshold_series("amount"),
            *_threshold_series("count"),
            *_threshold_series("hour", alert=0.5),
            {"series": 'loopline_feature_psi{feature="amount", model_version="3"}', "values": "0.02x4 0.31x30"},
            {"series": 'loopline_feature_psi{feature="count", model_version="3"}', "values": "0.03x34"},
            {"series": 'loopline_feature_psi{feature="hour", model_version="3"}', "values": "0.31x34"},
        ],
        [
            ("4m", "LooplineFeatureSkew", []),
            (
                "6m",
                "LooplineFeatureSkew",
                [
                    (
                        {"feature": "amount", "model_version": "3", "severity": "page"},
                        "amount has moved away from its training data (PSI 0.31, v3)",
                    )
                ],
            ),
            (
                "30m",
                "LooplineFeatureSkewWarning",
                [({"feature": "hour", "model_version": "3", "severity": "ticket"}, "hour is drifting (PSI 0.31, v3)")],
            ),
        ],
    ),
    (
        "a mix of categories and a numeric distribution that moved",
        [
            *_threshold_series("channel"),
            *_threshold_series("amount"),
            {"series": 'loopline_feature_linf_distance{feature="channel", model_version="3"}', "values": "0.2x20"},
            {"series": 'loopline_feature_js_divergence{feature="amount", model_version="3"}', "values": "0.05x20"},
        ],
        [
            (
                "10m",
                "LooplineCategoryShift",
                [
                    (
                        {"feature": "channel", "model_version": "3", "severity": "page"},
                        "channel: a category's share moved by 0.20 since training (v3)",
                    )
                ],
            ),
            ("10m", "LooplineFeatureDistributionShift", []),
        ],
    ),
    (
        "a value mismatch pages while replays run; a healthy feature does not, nor an old replay's ratio",
        [
            {"series": 'loopline_feature_consistency_mismatch_ratio{feature="txn_count_5m"}', "values": "0.25x40"},
            {"series": 'loopline_feature_consistency_mismatch_ratio{feature="amount_sum_1h"}', "values": "0x40"},
            # Replays run every minute for 20 minutes, then stop: the last ratio stays, the page must not.
            {"series": "loopline_monitor_last_replay_timestamp_seconds", "values": "0+60x20 1200x20"},
        ],
        [
            (
                "15m",
                "LooplineFeatureInconsistent",
                [
                    (
                        {"feature": "txn_count_5m", "severity": "page"},
                        "txn_count_5m online differs from the offline recompute for 25% of replayed requests",
                    )
                ],
            ),
            ("35m", "LooplineFeatureInconsistent", []),
        ],
    ),
    (
        "stale features, a lagging job, a defaulted feature, a slow scorer, a monitor that stopped measuring",
        [
            {
                "series": 'flink_taskmanager_job_task_operator_currentEmitEventTimeLag{instance="j1", subtask_index="0"}',
                "values": "120000x30",
            },
            {
                "series": 'flink_taskmanager_job_task_operator_pendingRecords{instance="j1", subtask_index="0"}',
                "values": "20000x30",
            },
            {"series": 'loopline_feature_defaulted_ratio{feature="amount", model_version="3"}', "values": "0.3x30"},
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="0.05"}', "values": "0+10x30"},
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="0.1"}', "values": "0+100x30"},
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="+Inf"}', "values": "0+100x30"},
            {"series": 'up{job="loopline-monitor", instance="m1"}', "values": "1x30"},
            {"series": 'loopline_monitor_last_check_timestamp_seconds{job="loopline-monitor", instance="m1"}', "values": "60x30"},
        ],
        [
            (
                "10m",
                "LooplineFeaturesStale",
                [({"instance": "j1", "severity": "page"}, "The feature job emits events 120000 ms behind their time (j1)")],
            ),
            (
                "15m",
                "LooplineFeatureJobLagging",
                [({"instance": "j1", "severity": "warn"}, "The feature job has 20000 events waiting in Kafka (j1)")],
            ),
            (
                "15m",
                "LooplineFeatureOftenDefaulted",
                [
                    (
                        {"feature": "amount", "model_version": "3", "severity": "ticket"},
                        "amount fell back to its default for 30% of requests (v3)",
                    )
                ],
            ),
            ("20m", "LooplineScorerSlow", [({"instance": "s1", "severity": "warn"}, "Scorer s1 answers in 99.44ms at p99")]),
            (
                "15m",
                "LooplineMonitorDown",
                [({"job": "loopline-monitor", "instance": "m1", "severity": "warn"}, "The skew monitor is not measuring (m1)")],
            ),
        ],
    ),
    (
        "the feature job down, the monitor down; the scorer's server faults but not its refusals",
        [
            {"series": 'up{job="loopline-feature-job", instance="j1"}', "values": "1 1 0x20"},
            {"series": 'up{job="loopline-monitor", instance="m1"}', "values": "0x20"},
            {"series": 'loopline_scoring_requests_total{instance="s1", door="http", status="200"}', "values": "0+100x20"},
            {"series": 'loopline_scoring_requests_total{instance="s1", door="http", status="500"}', "values": "0+5x20"},
            {"series": 'loopline_scoring_requests_total{instance="s2", door="http", status="200"}', "values": "0+100x20"},
            {"series": 'loopline_scoring_requests_total{instance="s2", door="http", status="503"}', "values": "0+50x20"},
        ],
        [
            ("3m", "LooplineFeatureJobDown", []),
            (
                "6m",
                "LooplineFeatureJobDown",
                [
                    (
                        {"job": "loopline-feature-job", "instance": "j1", "severity": "page"},
                        "The feature job's metrics endpoint j1 is down",
                    )
                ],
            ),
            (
                "10m",
                "LooplineMonitorDown",
                [({"job": "loopline-monitor", "instance": "m1", "severity": "warn"}, "The skew monitor is not measuring (m1)")],
            ),
            ("15m", "LooplineScorerErrors", [({"instance": "s1", "severity": "page"}, "Scorer s1 fails 4.762% of requests")]),
        ],
    ),
    (
        "a canary failing more than prod, and one failing as little",
        [
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="canary", version="4", outcome="ok"}',
                "values": "0+95x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="canary", version="4", outcome="error"}',
                "values": "0+5x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="prod", version="3", outcome="ok"}',
                "values": "0+100x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="prod", version="3", outcome="error"}',
                "values": "0x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s2", alias="canary", version="4", outcome="ok"}',
                "values": "0+100x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s2", alias="canary", version="4", outcome="error"}',
                "values": "0x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s2", alias="prod", version="3", outcome="ok"}',
                "values": "0+100x30",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s2", alias="prod", version="3", outcome="error"}',
                "values": "0x30",
            },
        ],
        [
            (
                "20m",
                "LooplineCanaryWorseThanProd",
                [
                    (
                        {"instance": "s1", "severity": "page"},
                        "The canary on s1 fails 5% of its requests, over 1 point more than prod",
                    )
                ],
            ),
        ],
    ),
    (
        "a long healthy run: nothing fires",
        [
            *_threshold_series("amount"),
            {"series": 'loopline_feature_psi{feature="amount", model_version="3"}', "values": "0.03 0.05 0.04 0.02x120"},
            {"series": 'loopline_feature_js_divergence{feature="amount", model_version="3"}', "values": "0.004x120"},
            {"series": 'loopline_feature_defaulted_ratio{feature="amount", model_version="3"}', "values": "0.01x120"},
            {"series": 'loopline_feature_consistency_mismatch_ratio{feature="amount"}', "values": "0x120"},
            {"series": 'up{job="loopline-feature-job", instance="j1"}', "values": "1x120"},
            {"series": 'up{job="loopline-monitor", instance="m1"}', "values": "1x120"},
            {"series": 'loopline_monitor_last_check_timestamp_seconds{instance="m1"}', "values": "0+60x120"},
            {"series": 'loopline_scoring_requests_total{instance="s1", door="http", status="200"}', "values": "0+100x120"},
            *_threshold_series("channel"),
            {"series": 'loopline_feature_linf_distance{feature="channel", model_version="3"}', "values": "0.02x120"},
            {
                "series": 'flink_taskmanager_job_task_operator_currentEmitEventTimeLag{instance="j1", subtask_index="0"}',
                "values": "800x120",
            },
            {
                "series": 'flink_taskmanager_job_task_operator_pendingRecords{instance="j1", subtask_index="0"}',
                "values": "40x120",
            },
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="0.01"}', "values": "0+99x120"},
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="0.05"}', "values": "0+100x120"},
            {"series": 'loopline_scoring_stage_seconds_bucket{instance="s1", stage="total", le="+Inf"}', "values": "0+100x120"},
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="canary", version="4", outcome="ok"}',
                "values": "0+100x120",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="canary", version="4", outcome="error"}',
                "values": "0x120",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="prod", version="3", outcome="ok"}',
                "values": "0+100x120",
            },
            {
                "series": 'loopline_scoring_model_requests_total{instance="s1", alias="prod", version="3", outcome="error"}',
                "values": "0x120",
            },
            {"series": "loopline_monitor_last_replay_timestamp_seconds", "values": "0+60x120"},
        ],
        [("2h", alert, []) for alert in _rules(MONITORING)],
    ),
]


@pytest.mark.parametrize("name, series, expected", CASES, ids=[case[0] for case in CASES])
def test_monitoring_rules_fire_as_expected_and_stay_quiet_on_healthy_series(name, series, expected, tmp_path: Path) -> None:
    _promtool("check", "rules", str(MONITORING))
    rules = _rules(MONITORING)
    tests = {
        "rule_files": [str(MONITORING)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": alert,
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": {"summary": summary, "runbook": rules[alert]["annotations"]["runbook"]},
                            }
                            for labels, summary in alerts
                        ],
                    }
                    for at, alert, alerts in expected
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(json.dumps(tests))  # JSON is YAML
    _promtool("test", "rules", "test.yml", cwd=tmp_path)
