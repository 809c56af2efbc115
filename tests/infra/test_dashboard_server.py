"""The skew alert dashboard in headless Chromium (Debian's `chromium`), over the stack's real Prometheus.

The monitor's metrics come from its own MonitorMetrics on the port the stack's Prometheus scrapes (the monitor
itself is tested in tests/feedback_loop/test_monitor.py); the page must load with no console error, show every feature
quiet, and after an injected skew show that feature as alerting. The screenshot is kept in .loopline/test-artifacts/.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import uvicorn
from prometheus_client import start_http_server

from feedback_loop.drift import FeatureSkew, SkewThresholds
from feedback_loop.monitor_metrics import MonitorMetrics
from infra.dashboard_server import dashboard_app
from infra.jaeger import trace_summaries
from infra.service import free_port, wait_until
from loopline.components import model_release
from loopline.monitoring import model_versions
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from online.tracing import RequestTracer

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".loopline" / "test-artifacts"
FEATURES = ["request:amount", "user_transaction_features:txn_count_1h", "request:channel"]
TRACED_SERVICE = "dashboard-test-scorer"

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (make setup installs it)")


def _skew(feature: str, psi: float) -> FeatureSkew:
    categorical = feature == "request:channel"
    return FeatureSkew(
        feature,
        "categorical" if categorical else "numeric",
        2_000,
        psi,
        None if categorical else psi / 8,
        psi / 3 if categorical else None,
        0.0,
        0.01,
    )


def _chromium(url: str, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on ``url`` with its console on stderr, given 20 s of virtual time for the page's fetches."""
    return subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=20000",
            "--window-size=1400,1100",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line]


def test_chromium_reports_a_pages_console_errors() -> None:
    """The positive control: a page that logs an error and throws shows both on Chromium's stderr."""
    probe = _chromium("data:text/html,<script>console.error('probe-error'); undefinedFunction();</script>")
    errors = _console_errors(probe.stderr)
    assert any("probe-error" in line for line in errors) and any("undefinedFunction" in line for line in errors), probe.stderr[
        -2000:
    ]


@pytest.fixture
def dashboard(applied: Settings, stack, tmp_path: Path):
    """The monitor's metrics on the scraped port, the dashboard on a free one; yields (url, publish(psi by feature))."""
    metrics = MonitorMetrics()
    server, _ = start_http_server(applied.monitor.metrics_port, addr="127.0.0.1", registry=metrics.collector_registry)
    release = model_release(applied)
    name = applied.serving.model_name
    version = release.register(name, write_linear_model(tmp_path / "m.onnx", ["request:amount"], np.ones(1), 0.0))
    release.promote(name, version, "test", "the dashboard shows it as prod")
    page = dashboard_app(stack.prometheus.address, lambda: model_versions(applied), stack.jaeger.address, TRACED_SERVICE)
    port = free_port()
    web = uvicorn.Server(uvicorn.Config(page, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    assert wait_until(lambda: web.started, 20, 0.05)

    def publish(psi: dict[str, float]) -> None:
        thresholds = dict.fromkeys(FEATURES, SkewThresholds())
        metrics.publish_skews({version: [_skew(f, v) for f, v in psi.items()]}, 500, thresholds, "snap-test")

    try:
        yield f"http://127.0.0.1:{port}/", publish, version
    finally:
        web.should_exit = True
        thread.join(10)
        server.shutdown()


def _export_a_trace(stack) -> str:
    """A failed request's trace, exported through the scorer's tracer into the stack's Jaeger; its trace id once Jaeger
    lists it."""
    tracer = RequestTracer(
        f"http://{stack.jaeger.host}:{stack.jaeger.otlp_port}/v1/traces", service=TRACED_SERVICE, sample_ratio=0.0, slow_ms=1_000
    )
    began = time.perf_counter()
    trace = tracer.begin(None, began)
    trace.stage("feature_fetch", began, began + 0.002)
    trace.stage("redis round trip", began + 0.0005, began + 0.0015, part_of="feature_fetch", kind="CLIENT")
    trace.stage("inference", began + 0.002, began + 0.004)
    assert tracer.finish(trace, "POST /v1/score", "SERVER", began + 0.005, error="500", **{"loopline.request_id": "r-1"})
    tracer.close()
    assert wait_until(
        lambda: any(t["trace_id"] == trace.trace_id_hex for t in trace_summaries(stack.jaeger.address, TRACED_SERVICE)), 20, 0.2
    )
    return trace.trace_id_hex


def _scraped(prometheus: str, feature: str, psi: float) -> bool:
    result = requests.get(
        f"{prometheus}/api/v1/query", params={"query": f'loopline_feature_psi{{feature="{feature}"}}'}, timeout=5
    ).json()["data"]["result"]
    return bool(result) and abs(float(result[0]["value"][1]) - psi) < 1e-9


def test_the_page_loads_clean_and_shows_an_injected_skew_as_alerting(dashboard, stack) -> None:
    url, publish, version = dashboard
    publish({feature: 0.02 for feature in FEATURES})
    assert wait_until(lambda: _scraped(stack.prometheus.address, FEATURES[0], 0.02), 60, 0.5), (
        "Prometheus never scraped the monitor"
    )

    trace_id = _export_a_trace(stack)
    quiet = _chromium(url, "--dump-dom")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert _console_errors(quiet.stderr) == [], _console_errors(quiet.stderr)
    assert 'data-loaded="true"' in quiet.stdout, quiet.stdout[-3000:]
    for feature in FEATURES:
        assert f'<tr class="ok" data-feature="{feature}" data-version="{version}">' in quiet.stdout, quiet.stdout[-3000:]
    assert f'<tr data-version="{version}">' in quiet.stdout  # the models panel lists the prod version
    # The traces panel lists the trace Jaeger holds, failed, with its stages (the part of a stage drawn as such).
    assert f'<tr data-trace="{trace_id}" class="alerting">' in quiet.stdout, quiet.stdout[-3000:]
    assert '<div data-stage="inference">' in quiet.stdout and '<div data-stage="redis round trip" class="part">' in quiet.stdout
    # The pass-through: a query Prometheus refuses is the caller's fault (4xx, its reason); other endpoints are not passed.
    refused = requests.get(f"{url}api/prometheus/query", params={"query": "sum("}, timeout=10)
    assert refused.status_code == 400 and "parse error" in refused.json()["detail"], refused.text
    assert requests.get(f"{url}api/prometheus/admin", timeout=10).status_code == 404

    # Amounts skew: the feature's PSI crosses its alert threshold; the page marks it (the rule pends for its `for:`).
    publish({FEATURES[0]: 0.6, FEATURES[1]: 0.02, FEATURES[2]: 0.02})
    assert wait_until(lambda: _scraped(stack.prometheus.address, FEATURES[0], 0.6), 60, 0.5)
    skewed = _chromium(url, "--dump-dom")
    assert _console_errors(skewed.stderr) == [], _console_errors(skewed.stderr)
    assert f'<tr class="alerting" data-feature="{FEATURES[0]}" data-version="{version}">' in skewed.stdout, skewed.stdout[-3000:]
    assert f'<tr class="ok" data-feature="{FEATURES[1]}"' in skewed.stdout and "ALERTING" in skewed.stdout

    def skew_rule_active() -> bool:
        alerts = requests.get(f"{stack.prometheus.address}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return any(
            a["labels"]["alertname"] == "LooplineFeatureSkew" and a["labels"].get("feature") == FEATURES[0] for a in alerts
        )

    assert wait_until(skew_rule_active, 30, 0.5), "the skew rule is not pending"
    pending = _chromium(url, "--dump-dom")
    assert 'data-alert="LooplineFeatureSkew"' in pending.stdout

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    shot = _chromium(url, f"--screenshot={screenshot}")
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
