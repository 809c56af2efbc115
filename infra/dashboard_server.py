"""The skew alert dashboard's server (`loopline dashboard`): the page under ``infra/dashboard/`` (uPlot vendored from
npm, no CDN), Prometheus' HTTP API passed through on the same origin, the model versions from a callable, and the
scorer's newest request traces from Jaeger's query API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import requests
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from infra.jaeger import trace_summaries

#: The page and its scripts.
PAGE_DIR = Path(__file__).parent / "dashboard"
#: The Prometheus API endpoints the page reads; nothing else is passed through.
PROMETHEUS_ENDPOINTS = frozenset({"query", "query_range", "alerts", "rules"})


def dashboard_app(
    prometheus_url: str,
    models: Callable[[], dict],
    jaeger_url: str | None = None,
    trace_service: str = "",
    timeout_s: float = 5.0,
) -> FastAPI:
    """The dashboard over the Prometheus at ``prometheus_url``; ``models()`` gives the model's versions and aliases;
    the traces of ``trace_service`` come from the Jaeger at ``jaeger_url`` (none listed without one)."""
    app = FastAPI(title="Loopline dashboard", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=PAGE_DIR), name="static")

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(PAGE_DIR / "index.html")

    @app.get("/api/prometheus/{endpoint}")
    def prometheus(endpoint: str, request: Request) -> dict:
        if endpoint not in PROMETHEUS_ENDPOINTS:
            raise HTTPException(404, f"the dashboard passes only {sorted(PROMETHEUS_ENDPOINTS)} through")
        try:
            reply = requests.get(f"{prometheus_url}/api/v1/{endpoint}", params=dict(request.query_params), timeout=timeout_s)
        except requests.RequestException as err:
            raise HTTPException(502, f"Prometheus at {prometheus_url} does not answer: {err}") from err
        if 400 <= reply.status_code < 500:  # the query's fault (bad PromQL, a bad parameter): the caller's to fix
            raise HTTPException(reply.status_code, f"Prometheus refused the query: {reply.text[:500]}")
        if reply.status_code != 200:
            raise HTTPException(502, f"Prometheus answered {reply.status_code}: {reply.text[:200]}")
        return reply.json()

    @app.get("/api/traces")
    def traces() -> dict:
        if jaeger_url is None:
            return {"jaeger": None, "traces": []}
        try:
            return {"jaeger": jaeger_url, "traces": trace_summaries(jaeger_url, trace_service)}
        except (requests.RequestException, ValueError, KeyError) as err:
            raise HTTPException(502, f"Jaeger at {jaeger_url} does not answer: {err}") from err

    @app.get("/api/models")
    def model_versions() -> dict:
        try:
            return models()
        except Exception as err:  # the model registry is down: the page still shows Prometheus' side
            raise HTTPException(502, f"the model registry does not answer: {err}") from err

    return app
