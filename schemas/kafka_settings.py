"""Kafka's settings model (``kafka``): the stack's own nodes or a cluster elsewhere, and how Loopline's topics are
replicated on it. Every client's librdkafka settings are built from it by ``schemas/kafka_config.py``;
``loopline/settings.py`` composes and reads it."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field, model_validator
from pydantic_settings import NoDecode

from schemas.setting_types import comma_separated
from schemas.topics import Replication, replication_for


class KafkaSettings(BaseModel):
    """Kafka: the stack's own KRaft nodes (combined broker + controller) or a cluster elsewhere
    (``bootstrap_servers``), and how Loopline's topics are replicated on it."""

    host: str = "127.0.0.1"
    port: int = Field(default=9092, ge=1, le=65535, description="The stack's first node; node i listens on port + 2i.")
    controller_port: int = Field(default=9093, ge=1, le=65535, description="The first node's controller; node i: + 2i.")
    brokers: int = Field(default=1, ge=1, le=9, description="How many nodes `loopline stack up` starts (--kafka-brokers).")
    bootstrap_servers: Annotated[list[str], NoDecode, BeforeValidator(comma_separated)] = Field(
        default_factory=list,
        description="host:port of a cluster's brokers (a list, or comma-separated); empty: the stack's own nodes.",
    )
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        description="Replicas of each Loopline topic; unset: the shape's, min(3, brokers) (the bootstrap_servers listed, "
        "else the stack's own nodes: 3 after `stack up --kafka-brokers 3`).",
    )
    min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        description="Replicas an acks=all write needs; unset: one fewer than replication_factor from 2 replicas up, else 1.",
    )
    heap_mb: int = Field(default=512, ge=128)
    start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a broker may take to answer: after a kill -9 it recovers its logs first, which under "
        "load on a small machine takes a minute.",
    )
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every Loopline Kafka client and the Flink jobs' tables "
        "(security.protocol, sasl.*, ssl.*): over each client's tuning defaults; a setting a client needs to be "
        "correct (its group.id, idempotence, acks=all, isolation.level, transactional.id) is refused if contradicted.",
    )

    @model_validator(mode="after")
    def _replicas_fit(self) -> KafkaSettings:
        factor, min_insync = self.replication
        if min_insync > factor:
            raise ValueError(
                f"kafka.min_insync_replicas ({min_insync}) exceeds kafka.replication_factor ({factor}): no write could "
                f"ever be acknowledged by all in-sync replicas — fix: set kafka.min_insync_replicas to at most {factor}, "
                f"or leave it unset ({replication_for(factor).min_insync} for {factor} replicas)"
            )
        if not self.bootstrap_servers and factor > self.brokers:
            raise ValueError(
                f"kafka.replication_factor {factor} needs as many brokers; the stack starts {self.brokers} — fix: leave "
                f"kafka.replication_factor unset (the stack's shape gives {self.shape.factor}), or start more brokers "
                "(kafka.brokers, `stack up --kafka-brokers`), or name a cluster (kafka.bootstrap_servers)"
            )
        return self

    @property
    def shape(self) -> Replication:
        """The replication the stack's shape gives its topics (min(3, its nodes), see ``replication_for``). A cluster
        named by ``bootstrap_servers`` has no shape Loopline knows (one address may front many brokers): one replica
        unless set, as for any Kafka client."""
        return replication_for(1 if self.bootstrap_servers else self.brokers)

    @property
    def replication(self) -> Replication:
        """The replication Loopline's topics get: ``replication_factor`` and ``min_insync_replicas`` where set, else
        the shape's (a min ISR follows a set replication factor)."""
        factor = self.replication_factor if self.replication_factor is not None else self.shape.factor
        min_insync = self.min_insync_replicas if self.min_insync_replicas is not None else replication_for(factor).min_insync
        return Replication(factor, min_insync)

    def node_ports(self) -> list[tuple[int, int]]:
        """(listener, controller) port of each of the stack's own nodes."""
        return [(self.port + 2 * i, self.controller_port + 2 * i) for i in range(self.brokers)]

    @property
    def bootstrap(self) -> str:
        """The comma-separated addresses every client connects to (librdkafka's and Flink's form)."""
        return ",".join(self.bootstrap_servers or [f"{self.host}:{port}" for port, _ in self.node_ports()])
