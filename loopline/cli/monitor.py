"""``loopline monitor`` and ``loopline dashboard``: the skew and consistency monitor and its dashboard."""

from __future__ import annotations

from loopline.cli import context


def monitor() -> None:
    """Watch the prediction log for feature skew against the reference snapshot and replay a sample against the offline
    recompute; Prometheus metrics on monitor.metrics_port. Runs until SIGTERM."""
    from prometheus_client import start_http_server

    from feedback_loop.monitor_metrics import MonitorMetrics
    from loopline.monitoring import build_monitor, wait_for_reference

    config = context.settings()
    metrics = MonitorMetrics()
    start_http_server(config.monitor.metrics_port, addr=config.serving.host, registry=metrics.collector_registry)
    wait_for_reference(config, lambda err: context.console.print(f"monitor: waiting for a reference snapshot: {err}"))
    monitor = build_monitor(config, metrics)
    context.console.print(
        f"monitor: skew against snapshot {monitor.window.reference_id}, metrics on "
        f"http://{config.serving.host}:{config.monitor.metrics_port}/metrics"
    )
    monitor.run()


def dashboard() -> None:
    """Serve the skew alert dashboard: features' skew and consistency, alerts firing, model versions, scorer latency."""
    import uvicorn

    from infra.dashboard_server import dashboard_app
    from loopline.monitoring import model_versions

    config = context.settings()
    page = dashboard_app(
        f"http://{config.prometheus.host}:{config.prometheus.port}",
        lambda: model_versions(config),
        config.jaeger.query_url,
        config.serving.tracing.service_name,
    )
    context.console.print(
        f"dashboard: http://{config.dashboard.host}:{config.dashboard.port}/ (Prometheus at "
        f"http://{config.prometheus.host}:{config.prometheus.port}, Jaeger at {config.jaeger.query_url})"
    )
    uvicorn.run(page, host=config.dashboard.host, port=config.dashboard.port, log_level="warning")
