"""The scorer's Prometheus alert rules: valid, firing as their unit tests say, on metrics the scorer exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from online.metrics import ScorerMetrics

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "infra" / "alerts" / "scoring.rules.yml"


def _promtool(*args: str, cwd: Path = REPO) -> None:
    result = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_are_valid_and_fire_as_their_unit_tests_say() -> None:
    _promtool("check", "rules", str(RULES))
    _promtool("test", "rules", "scoring_rules_test.yml", cwd=REPO / "tests" / "alerts")


def test_rules_only_use_metrics_the_scorer_exports() -> None:
    exported = generate_latest(ScorerMetrics().registry).decode()
    expressions = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    used = {name for expr in expressions for name in re.findall(r"loopline_\w+", expr)}
    assert used and all(re.search(rf"^# TYPE {name} ", exported, re.M) for name in used), used
    # A refusal must be an increase for the alert to see it: its counters start at 0.
    assert 'loopline_scoring_model_refusals_total{reason="artifact"} 0.0' in exported
