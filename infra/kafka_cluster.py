"""The stack's Kafka: one KRaft node, or several forming one cluster (each a combined broker + controller)."""

from __future__ import annotations

from pathlib import Path

from infra.kafka import KafkaBroker
from infra.service import ServiceStatus


class KafkaCluster:
    """``brokers`` KRaft nodes on ``host``, node i (from 0) listening on ``port + 2i`` and its controller on
    ``controller_port + 2i``. One node is the stack's classic single broker (named ``kafka``); several are nodes
    ``kafka-1`` … with a static controller quorum of all of them."""

    def __init__(self, brokers: int, host: str, port: int, controller_port: int, data_dir: Path, jars_dir: Path,
                 run_dir: Path, log_dir: Path, heap_mb: int = 512, start_timeout_s: float = 60.0) -> None:  # fmt: skip
        addresses = [(node + 1, port + 2 * node, controller_port + 2 * node) for node in range(brokers)]
        voters = [(node, host, controller) for node, _, controller in addresses] if brokers > 1 else None
        self.nodes = tuple(
            KafkaBroker(host, listener, controller, data_dir, jars_dir, run_dir, log_dir, heap_mb, start_timeout_s,
                        node_id=node, voters=voters)  # fmt: skip
            for node, listener, controller in addresses
        )

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        """The node with ``node_id`` (1-based, as in the cluster's metadata)."""
        return self.nodes[node_id - 1]

    def formatted(self) -> bool:
        """Whether any node's storage holds data (formatted by an earlier start)."""
        return any((node.data_dir / "meta.properties").exists() for node in self.nodes)

    def start(self) -> bool:
        """Start every node that is not running, then wait until each answers (a cluster's nodes elect a controller
        only once a majority of them runs, so none is waited for alone). True if any process was started."""
        if len(self.nodes) == 1:
            return self.nodes[0].start()
        launched = [node.launch() for node in self.nodes]
        for node, process in zip(self.nodes, launched, strict=True):
            node.await_ready(process)
        return any(process is not None for process in launched)

    def stop(self) -> bool:
        """Stop every node; False if none ran."""
        return any([node.stop() for node in reversed(self.nodes)])

    def wipe(self) -> None:
        for node in self.nodes:
            node.wipe()

    def status(self) -> list[ServiceStatus]:
        return [node.status() for node in self.nodes]

    def hanging_transactions(self, older_than_min: int = 1) -> list[tuple[str, int, int]]:
        """Hanging transactions (``KafkaBroker.hanging_transactions``) on the partitions each running node leads."""
        return [found for node in self.nodes if node.pid() is not None for found in node.hanging_transactions(older_than_min)]
