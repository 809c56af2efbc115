"""The feature store's settings models: its online store (``redis``) and its Feast registry (``feature_store``);
``loopline/settings.py`` composes and reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import NoDecode

from schemas.setting_types import comma_separated


class RedisSettings(BaseModel):
    """Redis, the Feast online store: the stack's own server, or a Redis Cluster of the stack's own nodes
    (``mode: cluster``, Feast's ``redis_type: redis_cluster``), or either elsewhere, named by its ``nodes``."""

    host: str = "127.0.0.1"
    port: int = Field(default=6379, ge=1, le=65535, description="The server's; in a cluster node i listens on port + i.")
    start_timeout_s: float = Field(default=20.0, gt=0)
    password: SecretStr | None = Field(default=None, description="For a Redis that requires AUTH.")
    ssl: bool = Field(default=False, description="Connect with TLS.")
    mode: Literal["standalone", "cluster"] = Field(default="standalone", description="cluster: Redis Cluster (--redis-cluster).")
    cluster_masters: int = Field(default=3, ge=3, le=16, description="Masters of the stack's cluster (Redis Cluster needs 3).")
    cluster_replicas: int = Field(default=1, ge=0, le=3, description="Replicas of each master: one takes over when it fails.")
    cluster_bus_port: int = Field(default=16379, ge=1, le=65535, description="Node i's cluster bus (node to node): + i.")
    cluster_node_timeout_ms: int = Field(
        default=5_000, ge=100, description="How long a master may not answer before the cluster fails it over to a replica."
    )
    nodes: Annotated[list[str], NoDecode, BeforeValidator(comma_separated)] = Field(
        default_factory=list,
        description="host:port of a Redis elsewhere: a cluster's nodes, any that answer (a list, or comma-separated); "
        "empty: the stack's own (host, port).",
    )
    write_acks: int | None = Field(
        default=None,
        ge=0,
        le=3,
        description="Replicas each batch of the feature job's rows must reach (Redis WAIT) before it counts as written, "
        "so a checkpoint completes only once its rows survive a failover; unset: the shape's (1 on the stack's own "
        "cluster with replicas, else 0; for a Redis elsewhere, set it to the replicas its masters have).",
    )
    write_ack_timeout_ms: int = Field(
        default=2_000,
        ge=1,
        description="How long a batch waits for those replicas; past it the write fails and the job restarts from its "
        "last checkpoint, writing the rows again.",
    )

    @model_validator(mode="after")
    def _acks_fit(self) -> RedisSettings:
        own = 0 if self.mode == "standalone" else self.cluster_replicas
        if not self.nodes and self.write_acks is not None and self.write_acks > own:
            raise ValueError(
                f"redis.write_acks {self.write_acks}: the stack's own Redis has {own} replica(s) per master, so no write "
                f"could ever be acknowledged (leave it unset, or raise redis.cluster_replicas with redis.mode cluster)"
            )
        return self

    @property
    def replica_acks(self) -> int:
        """How many replicas each of the feature job's row batches must reach: ``write_acks``, else the shape's."""
        if self.write_acks is not None:
            return self.write_acks
        return 1 if self.mode == "cluster" and not self.nodes and self.cluster_replicas > 0 else 0

    @property
    def node_ports(self) -> list[int]:
        """The client port of each of the stack's nodes: one server, or every master and replica of the cluster."""
        nodes = self.cluster_masters * (1 + self.cluster_replicas) if self.mode == "cluster" else 1
        return [self.port + i for i in range(nodes)]

    @property
    def addresses(self) -> list[str]:
        """host:port of every node the clients start from: ``nodes``, else the stack's own."""
        return self.nodes or [f"{self.host}:{port}" for port in self.node_ports]


class FeatureStoreSettings(BaseModel):
    """The project's Feast registry."""

    feast_registry_path: Path | None = Field(
        default=None,
        description="Default: the Feast registry the repo's feature_store.yaml names, which `feast` in the repo uses too.",
    )
