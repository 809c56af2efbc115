"""The stack's Kafka: one KRaft node, or several forming one cluster (each a combined broker + controller)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.kafka import KafkaBroker
from infra.service import ServiceGroup


class KafkaCluster(ServiceGroup):
    """``brokers`` KRaft nodes, node i (from 0) on ``host`` (or ``host[i]``) listening on ``port + 2i`` and its
    controller on ``controller_port + 2i``, its command prefixed by ``launchers[i]`` when given (a host of its own).
    One node is the stack's classic single broker (named ``kafka``); several are nodes ``kafka-1`` … with a static
    controller quorum of all of them."""

    def __init__(
        self,
        brokers: int,
        host: str | Sequence[str],
        port: int,
        controller_port: int,
        data_dir: Path,
        jars_dir: Path,
        run_dir: Path,
        log_dir: Path,
        heap_mb: int = 512,
        start_timeout_s: float = 60.0,
        launchers: Sequence[Sequence[str]] | None = None,
    ) -> None:
        hosts = [host] * brokers if isinstance(host, str) else list(host)
        launchers = launchers or [()] * brokers
        addresses = [(node + 1, hosts[node], port + 2 * node, controller_port + 2 * node) for node in range(brokers)]
        voters = [(node, on, controller) for node, on, _, controller in addresses] if brokers > 1 else None
        self.nodes = tuple(
            KafkaBroker(
                on,
                listener,
                controller,
                data_dir,
                jars_dir,
                run_dir,
                log_dir,
                heap_mb,
                start_timeout_s,
                node_id=node,
                voters=voters,
                launcher=launchers[node - 1],
            )
            for node, on, listener, controller in addresses
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
        """Start every node that is not running and wait until each answers (``ServiceGroup.start_all``; a lone node
        as ``KafkaBroker.start``, which watches a restart for hanging transactions). True if any process was started."""
        return self.nodes[0].start() if len(self.nodes) == 1 else self.start_all()

    def _metadata(self):
        # log_level 0: a node that is down is expected during a fault, not worth a log line per attempt.
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
        return admin.list_topics(timeout=5.0)

    def busiest_leader(self) -> int:
        """The id of the node leading the most partitions now."""
        leaders = Counter(p.leader for topic in self._metadata().topics.values() for p in topic.partitions.values())
        return max(leaders, key=leaders.__getitem__)

    def under_replicated(self) -> int:
        """How many partitions have fewer replicas in sync than assigned; -1 while no node answers for metadata."""
        try:
            topics = self._metadata().topics.values()
        except KafkaException:
            return -1
        return sum(len(p.isrs) < len(p.replicas) for topic in topics for p in topic.partitions.values())

    def hanging_transactions(self, older_than_min: int = 1) -> list[tuple[str, int, int]]:
        """Hanging transactions (``KafkaBroker.hanging_transactions``) on the partitions each running node leads."""
        return [found for node in self.nodes if node.pid() is not None for found in node.hanging_transactions(older_than_min)]
