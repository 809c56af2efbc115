"""The local stack as a whole: set up, bring up, stop and report on Kafka, Redis, Prometheus, Jaeger and Flink."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from infra.flink import FlinkRuntime
from infra.jaeger import JaegerServer, ensure_jaeger
from infra.jars import ensure_jars
from infra.kafka_cluster import KafkaCluster
from infra.prometheus_server import PrometheusServer
from infra.redis import RedisServer
from infra.redis_cluster import RedisCluster
from infra.service import ManagedService, ServiceStatus
from infra.system_packages import ensure_packages


@dataclass(frozen=True)
class StartReport:
    """What ``up`` did for one service and how long it took."""

    name: str
    started: bool
    seconds: float


class LocalStack:
    """Kafka (KRaft, one node or a cluster), Redis (one server or a Redis Cluster), Prometheus and Jaeger as managed
    processes, and the embedded Flink runtime; the Flink jobs' checkpoints under ``checkpoints_dir`` describe this
    stack's Kafka."""

    def __init__(
        self,
        kafka: KafkaCluster,
        redis: RedisServer | RedisCluster,
        prometheus: PrometheusServer,
        jaeger: JaegerServer,
        flink: FlinkRuntime,
        jars_dir: Path,
        checkpoints_dir: Path,
    ) -> None:
        self.kafka = kafka
        self.redis = redis
        self.prometheus = prometheus
        self.jaeger = jaeger
        self.flink = flink
        self.jars_dir = jars_dir
        self.checkpoints_dir = checkpoints_dir

    @property
    def units(self) -> tuple:
        """What the stack starts, in order: each a service or a cluster of them (``start``, ``stop``, ``wipe``,
        ``nodes``)."""
        return (self.kafka, self.redis, self.prometheus, self.jaeger)

    @property
    def services(self) -> tuple[ManagedService, ...]:
        """The processes the stack runs, in start order."""
        return tuple(node for unit in self.units for node in unit.nodes)

    def setup(self) -> list[str]:
        """Install missing Debian packages, fetch missing jars and build Jaeger unless it is built; return what was
        added."""
        installed = ensure_packages()
        fetched = ensure_jars(self.jars_dir)
        built = ensure_jaeger(self.jars_dir)
        return installed + [path.name for path in fetched] + ([f"jaeger {built.parent.name}"] if built else [])

    def up(self) -> list[StartReport]:
        """Start every service that is not running and wait until each answers. Idempotent."""
        self.flink.check()
        reports = []
        for unit in self.units:
            began = time.monotonic()
            started = unit.start()
            reports += [StartReport(node.name, started, time.monotonic() - began) for node in unit.nodes]
        return reports

    def down(self, wipe: bool = False) -> list[str]:
        """Stop every service (reverse order); with ``wipe`` also delete their data and the jobs' checkpoints (their
        offsets and open transactions belong to the Kafka cluster wiped), killing them at once since their data goes.
        Returns what was stopped."""
        grace_s = 0.0 if wipe else 30.0
        stopped = [service.name for service in reversed(self.services) if service.stop(grace_s)]
        if wipe:
            for unit in self.units:
                unit.wipe()
            shutil.rmtree(self.checkpoints_dir, ignore_errors=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """One status row per service, the Flink runtime last."""
        return [service.status() for service in self.services] + [self.flink.status()]
