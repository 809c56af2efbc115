"""Jaeger for the scorer's request traces: its all-in-one binary (Jaeger v2, an OpenTelemetry Collector build) made
from the Go module proxy at a pinned version by `loopline stack setup`, cached beside the jars, and run with its
traces in memory.

It takes traces over OTLP/HTTP and answers Jaeger's query API (``/api/traces``). Its web UI is not in the module
(the UI is a separate JavaScript build that the module proxy does not serve), so its page is a placeholder; the
skew dashboard lists the traces from the query API instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import requests

from infra.errors import StackError
from infra.service import ManagedService

MODULE = "github.com/jaegertracing/jaeger"
#: Pinned: the query API and the config's shape are those of this release.
VERSION = "v1.76.0"
_PACKAGE = f"{MODULE}/cmd/jaeger"


def jaeger_binary(cache_dir: Path) -> Path:
    """Where the built binary is cached (``cache_dir``: the stack's jar cache)."""
    return cache_dir / f"jaeger-{VERSION}" / "jaeger"


def ensure_jaeger(cache_dir: Path) -> Path | None:
    """Build Jaeger unless it is cached (``go get -tool`` of the pinned release in a throwaway module, then ``go
    build``: a few minutes, once); the binary if it was built now, else None."""
    binary = jaeger_binary(cache_dir)
    if binary.exists():
        return None
    go = shutil.which("go")
    if go is None:
        raise StackError(
            "`go` is not installed: Jaeger is built from the Go module proxy",
            f"install Go (1.24 or later), or put a Jaeger {VERSION} binary at {binary}",
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jaeger-build-") as module:
        env = {**os.environ, "GOFLAGS": "-mod=mod"}
        steps = [
            [go, "mod", "init", "loopline.local/jaeger-build"],
            [go, "get", "-tool", f"{_PACKAGE}@{VERSION}"],
            [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary.with_suffix(".part")), _PACKAGE],
        ]
        for step in steps:
            done = subprocess.run(step, cwd=module, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                last = " | ".join(done.stderr.strip().splitlines()[-3:])
                raise StackError(
                    f"building Jaeger {VERSION} failed at `{' '.join(step[1:3])}`: {last}",
                    "is the Go module proxy reachable (GOPROXY)?",
                )
    binary.with_suffix(".part").rename(binary)
    return binary


class JaegerServer(ManagedService):
    """Jaeger all-in-one on ``host``: OTLP/HTTP on ``otlp_port``, the query API on ``query_port`` (gRPC on
    ``query_grpc_port``), health on ``health_port``; at most ``max_traces`` traces, in memory."""

    name = "jaeger"
    cmdline_marker = "jaeger"

    def __init__(
        self,
        binary: Path,
        host: str,
        otlp_port: int,
        query_port: int,
        query_grpc_port: int,
        health_port: int,
        max_traces: int,
        data_dir: Path,
        run_dir: Path,
        log_dir: Path,
        start_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(run_dir, log_dir, start_timeout_s)
        self.binary, self.host, self.max_traces = binary, host, max_traces
        self.otlp_port, self.query_port, self.query_grpc_port, self.health_port = (
            otlp_port,
            query_port,
            query_grpc_port,
            health_port,
        )
        self.config_file = data_dir / "jaeger" / "config.yaml"

    @property
    def address(self) -> str:
        """Its query API."""
        return f"http://{self.host}:{self.query_port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        return {
            "otlp_port": (self.host, self.otlp_port),
            "query_port": (self.host, self.query_port),
            "query_grpc_port": (self.host, self.query_grpc_port),
            "health_port": (self.host, self.health_port),
        }

    def version(self) -> str:
        return VERSION if self.binary.exists() else "not built (loopline stack setup)"

    def config(self) -> dict:
        """The collector configuration: the OTLP receiver into the in-memory store that the query API reads (JSON is
        YAML). Its own telemetry is off, so it binds no port but these."""
        at = lambda port: f"{self.host}:{port}"  # noqa: E731
        return {
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {
                    "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["jaeger_storage_exporter"]}
                },
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            },
            "extensions": {
                "healthcheckv2": {"use_v2": True, "http": {"endpoint": at(self.health_port)}},
                "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": self.max_traces}}}},
                "jaeger_query": {
                    "storage": {"traces": "memory"},
                    "http": {"endpoint": at(self.query_port)},
                    "grpc": {"endpoint": at(self.query_grpc_port)},
                },
            },
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": at(self.otlp_port)}}}},
            # Spans are searchable a fifth of a second after they arrive.
            "processors": {"batch": {"timeout": "200ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}},
        }

    def prepare(self) -> None:
        if not self.binary.exists():
            raise StackError(f"Jaeger is not built ({self.binary} is missing)", "loopline stack setup builds it")
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(self.config(), indent=2))

    def command(self) -> list[str]:
        return [str(self.binary), f"--config=file:{self.config_file}"]

    def ready(self) -> bool:
        """Its health check says healthy and its query API answers."""
        try:
            health = requests.get(f"http://{self.host}:{self.health_port}/status", timeout=1)
            return (
                health.ok and health.json().get("healthy") is True and requests.get(f"{self.address}/api/services", timeout=1).ok
            )
        except (requests.RequestException, ValueError):
            return False


def trace_spans(query_url: str, trace_id: str, timeout_s: float = 5.0) -> list[dict]:
    """The spans Jaeger at ``query_url`` holds for ``trace_id`` (its ``/api/traces/<id>``: each with ``operationName``,
    ``spanID``, ``references``, ``startTime``/``duration`` in µs and ``tags``); [] when it has none."""
    reply = requests.get(f"{query_url}/api/traces/{trace_id}", timeout=timeout_s)
    if reply.status_code == 404:
        return []
    reply.raise_for_status()
    return [span for trace in reply.json().get("data") or [] for span in trace["spans"]]


def recent_traces(query_url: str, service: str, limit: int = 20, lookback: str = "1h", timeout_s: float = 5.0) -> list[dict]:
    """The newest traces of ``service`` at Jaeger's query API (each with ``traceID``, ``spans`` and ``processes``)."""
    reply = requests.get(
        f"{query_url}/api/traces", params={"service": service, "limit": limit, "lookback": lookback}, timeout=timeout_s
    )
    reply.raise_for_status()
    return reply.json().get("data") or []


def _parent_in(span: dict, ids: set[str]) -> str | None:
    """The span's parent among ``ids`` (a remote caller's span is not among them)."""
    return next((ref["spanID"] for ref in span["references"] if ref["refType"] == "CHILD_OF" and ref["spanID"] in ids), None)


def trace_summaries(query_url: str, service: str, limit: int = 20, lookback: str = "1h") -> list[dict]:
    """The newest traces of ``service``, newest first, as a page lists them: each request's span (``operation``,
    ``request_id``, ``duration_ms``, ``error``: the failure it names, if any) and its stages (``name``, ``offset_ms``
    from the request's start, ``duration_ms``, ``depth``: 1 for a stage of the request, 2 for a part of a stage)."""
    summaries = []
    for trace in recent_traces(query_url, service, limit, lookback):
        spans = sorted(trace["spans"], key=lambda span: span["startTime"])
        ids = {span["spanID"] for span in spans}
        parents = {span["spanID"]: _parent_in(span, ids) for span in spans}
        root = next(span for span in spans if parents[span["spanID"]] is None)
        tags = {tag["key"]: tag["value"] for tag in root["tags"]}
        stages = [
            {
                "name": span["operationName"],
                "offset_ms": (span["startTime"] - root["startTime"]) / 1000,
                "duration_ms": span["duration"] / 1000,
                "depth": 1 if parents[span["spanID"]] == root["spanID"] else 2,
            }
            for span in spans
            if span is not root
        ]
        summaries.append(
            {
                "trace_id": trace["traceID"],
                "operation": root["operationName"],
                "start_us": root["startTime"],
                "duration_ms": root["duration"] / 1000,
                "request_id": tags.get("loopline.request_id"),
                "error": tags.get("error.type"),
                "stages": stages,
            }
        )
    return sorted(summaries, key=lambda summary: -summary["start_us"])
