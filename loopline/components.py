"""Builds Loopline's components from settings (the only place settings meet components)."""

from __future__ import annotations

from infra.flink import FlinkRuntime
from infra.kafka import KafkaBroker
from infra.redis import RedisServer
from infra.stack import LocalStack
from loopline.settings import Settings
from streams.synthetic import SyntheticConfig


def build_stack(settings: Settings) -> LocalStack:
    """The local stack configured by ``settings``."""
    data, logs, run, jars = (
        settings.resolved_data_dir,
        settings.resolved_logs_dir,
        settings.run_dir,
        settings.resolved_jars_dir,
    )
    kafka = KafkaBroker(
        host=settings.kafka.host,
        port=settings.kafka.port,
        controller_port=settings.kafka.controller_port,
        data_dir=data,
        jars_dir=jars,
        run_dir=run,
        log_dir=logs,
        heap_mb=settings.kafka.heap_mb,
        start_timeout_s=settings.kafka.start_timeout_s,
    )
    redis = RedisServer(
        host=settings.redis.host,
        port=settings.redis.port,
        data_dir=data,
        run_dir=run,
        log_dir=logs,
        start_timeout_s=settings.redis.start_timeout_s,
    )
    return LocalStack(kafka, redis, FlinkRuntime(jars), jars)


def synthetic_config(settings: Settings, rate_per_s: float, malformed_rate: float | None = None) -> SyntheticConfig:
    """The synthetic stream's knobs from settings, at ``rate_per_s``."""
    producer = settings.producer
    return SyntheticConfig(
        users=producer.users,
        merchants=producer.merchants,
        rate_per_s=rate_per_s,
        out_of_order_rate=producer.out_of_order_rate,
        max_out_of_order_s=producer.max_out_of_order_s,
        late_rate=producer.late_rate,
        malformed_rate=producer.malformed_rate if malformed_rate is None else malformed_rate,
    )
