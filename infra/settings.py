"""The local stack's settings models: Prometheus, Jaeger, the dashboard and the Flink session cluster;
``loopline/settings.py`` composes and reads them."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PrometheusSettings(BaseModel):
    """The local Prometheus (Debian's package): it scrapes every Loopline process and evaluates the alert rules."""

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=1, le=65535)
    scrape_interval_s: float = Field(default=5.0, gt=0, description="Also how often alert rules are evaluated.")
    start_timeout_s: float = Field(default=30.0, gt=0)


class JaegerSettings(BaseModel):
    """The local Jaeger (its all-in-one binary, built from the Go module proxy by `loopline stack setup`): it stores the
    scorer's request traces in memory and answers Jaeger's query API."""

    host: str = "127.0.0.1"
    otlp_port: int = Field(default=4318, ge=1, le=65535, description="Where it takes traces over OTLP/HTTP.")
    query_port: int = Field(default=16686, ge=1, le=65535, description="Its query API (/api/traces).")
    query_grpc_port: int = Field(default=16685, ge=1, le=65535)
    health_port: int = Field(default=13133, ge=1, le=65535, description="Its health check (/status).")
    max_traces: int = Field(default=100_000, ge=1, description="Traces it keeps in memory; the oldest go first.")
    start_timeout_s: float = Field(default=30.0, gt=0)

    @property
    def otlp_traces_url(self) -> str:
        return f"http://{self.host}:{self.otlp_port}/v1/traces"

    @property
    def query_url(self) -> str:
        return f"http://{self.host}:{self.query_port}"


class DashboardSettings(BaseModel):
    """The skew alert dashboard (`loopline dashboard`)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8050, ge=1, le=65535)


class FlinkSettings(BaseModel):
    """The standalone Flink session cluster of `loopline flink up` (``infra/flink_session.py``) and what jobs submitted
    to a cluster bring (``streams/job_archives.py``)."""

    host: str = "127.0.0.1"
    rest_port: int = Field(default=8081, ge=1, le=65535, description="The JobManager's REST API and Web UI.")
    rpc_port: int = Field(default=6123, ge=1, le=65535)
    taskmanagers: int = Field(default=1, ge=1)
    slots: int = Field(default=2, ge=1, description="Task slots per TaskManager.")
    python: str = Field(
        default="/usr/bin/python3",
        description="The TaskManagers' Python (the same version as Loopline's, at "
        "this path on every one): the jobs' environment archive is a venv over it.",
    )
