"""An Apache Kafka node in KRaft mode (combined broker + controller), run from Maven jars: the stack's only node, or
one of a cluster's (``infra/kafka_cluster.py``)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.errors import StackError
from infra.jars import kafka_jars_dir, pinned_versions, require_tool
from infra.service import ManagedService

_READINESS_GROUP = "loopline-readiness"
_TRANSACTIONS_TOOL = "org.apache.kafka.tools.TransactionsCommand"
_LOG4J_CONFIG = Path(__file__).with_name("kafka-log4j2.properties")


def parse_hanging_transactions(output: str) -> list[tuple[str, int, int]]:
    """(topic, partition, start offset) of each row of ``kafka-transactions.sh find-hanging``'s table: a header row
    (Topic, Partition, ProducerId, ProducerEpoch, CoordinatorEpoch, StartOffset, ...) then one row per hanging
    transaction, its cells separated by tabs and padded with spaces to the column's width."""
    rows = [[cell.strip() for cell in line.split("\t")] for line in output.splitlines() if "\t" in line]
    header = next((i for i, row in enumerate(rows) if row[:3] == ["Topic", "Partition", "ProducerId"]), None)
    if header is None:
        return []
    start = rows[header].index("StartOffset")
    # A row that is not the table's (a log line with a tab in it) is no transaction to abort.
    return [
        (row[0], int(row[1]), int(row[start]))
        for row in rows[header + 1 :]
        if len(row) > start and row[1].isdigit() and row[start].isdigit()
    ]


class KafkaBroker(ManagedService):
    """Apache Kafka, storage formatted on first start; its data survives stop/start.

    Alone (``voters`` None) it is its own quorum (``--standalone``). As node ``node_id`` of a cluster, ``voters`` lists
    every node's (id, host, controller port): a static quorum, and internal topics replicated on up to three nodes.
    ``launcher`` prefixes its command (``ip netns exec <host>``: a node on a host of its own, ``infra/netns.py``).
    """

    name = "kafka"
    cmdline_marker = "kafka.Kafka"

    def __init__(
        self,
        host: str,
        port: int,
        controller_port: int,
        data_dir: Path,
        jars_dir: Path,
        run_dir: Path,
        log_dir: Path,
        heap_mb: int = 512,
        start_timeout_s: float = 60.0,
        node_id: int = 1,
        voters: list[tuple[int, str, int]] | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        self.node_id, self.voters, self.launcher = node_id, voters, tuple(launcher)
        if voters is not None:
            self.name = f"kafka-{node_id}"
        super().__init__(run_dir, log_dir, start_timeout_s)
        self.host, self.port, self.controller_port = host, port, controller_port
        self.data_dir = data_dir / self.name
        self.jars_dir = jars_dir
        self.heap_mb = heap_mb
        self.config_file = run_dir / f"{self.name}-server.properties"
        self.cluster_id_file = data_dir / "kafka-cluster-id"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        return {"listener": (self.host, self.port), "controller": (self.host, self.controller_port)}

    def version(self) -> str:
        return pinned_versions().kafka

    def _java(self, main_class: str, *args: str, heap_mb: int = 256) -> list[str]:
        java = require_tool("java", "openjdk-17-jre-headless")
        classpath = kafka_jars_dir(self.jars_dir)
        if not classpath.is_dir():
            raise StackError(f"the Kafka jars are missing from {classpath}", "run `loopline stack setup`")
        return [
            java,
            f"-Xmx{heap_mb}m",
            f"-Xms{min(heap_mb, 256)}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            f"-Dlog4j2.configurationFile={_LOG4J_CONFIG}",
            "-cp",
            f"{classpath}/*",
            main_class,
            *args,
        ]

    def command(self) -> list[str]:
        return [*self.launcher, *self._java("kafka.Kafka", str(self.config_file), heap_mb=self.heap_mb)]

    def _write_config(self) -> None:
        controller = f"{self.host}:{self.controller_port}"
        nodes = len(self.voters or [()])
        # Internal topics on up to three nodes, and a transaction log write acknowledged by two of them: the
        # broker's defaults for a cluster; one node can hold one replica only.
        replicas, min_isr = min(nodes, 3), min(nodes, 2)
        quorum = (
            {"controller.quorum.voters": ",".join(f"{node}@{host}:{port}" for node, host, port in self.voters)}
            if self.voters is not None
            else {"controller.quorum.bootstrap.servers": controller}
        )
        settings = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            **quorum,
            "listeners": f"PLAINTEXT://{self.address},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.address}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "default.replication.factor": replicas,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # A lone consumer should not wait 3 s for peers that will never join.
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",
        }
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))

    def prepare(self) -> None:
        """Write the config; format storage on first start; refuse a data dir of another cluster or node.

        The nodes of a cluster share one cluster id (the first node to format writes it, the others read it)."""
        self._write_config()
        meta = self.data_dir / "meta.properties"
        cluster_id = self.cluster_id_file.read_text().strip() if self.cluster_id_file.exists() else None
        if meta.exists():
            found = dict(line.split("=", 1) for line in meta.read_text().splitlines() if "=" in line and not line.startswith("#"))
            if cluster_id is None or found.get("cluster.id") != cluster_id or found.get("node.id") != str(self.node_id):
                raise StackError(
                    f"stale Kafka data dir {self.data_dir} belongs to cluster {found.get('cluster.id')} "
                    f"(node {found.get('node.id')}), not this stack's",
                    "run `loopline stack down --wipe` (deletes that data) or set LOOPLINE_DATA_DIR elsewhere",
                )
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if cluster_id is None:
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            self.cluster_id_file.write_text(cluster_id)
        # `--cluster-id=` form: a base64 id may start with '-', which would read as an option. A static quorum
        # (controller.quorum.voters) is formatted as it is; a lone node bootstraps a quorum of itself.
        standalone = ["--standalone"] if self.voters is None else []
        self._run_tool(
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(self.config_file), *standalone
        )

    def _run_tool(self, main_class: str, *args: str) -> str:
        """Run one of Kafka's command-line tools; its output (StackError naming it if it fails)."""
        result = subprocess.run(self._java(main_class, *args), capture_output=True, text=True)
        if result.returncode != 0:
            last = " | ".join((result.stdout + result.stderr).strip().splitlines()[-2:])
            raise StackError(
                f"Kafka's {main_class.rsplit('.', 1)[1]} {args[-1] if args else ''} failed: {last}",
                f"see {self.log_file}; check {self.data_dir}",
            )
        return result.stdout

    def start(self) -> bool:
        """Start the broker unless it runs (see ``ManagedService.start``). After a restart over existing data, a
        watcher process (``infra/kafka_janitor.py``) aborts, for three minutes, transactions the crash left hanging."""
        restarting = (self.data_dir / "meta.properties").exists() and self.pid() is None
        started = super().start()
        # A cluster's other nodes write the markers a restarted node missed (its test shows none hang).
        if started and restarting and self.voters is None:
            with self.log_file.open("ab") as log:
                subprocess.Popen(
                    [sys.executable, "-m", "infra.kafka_janitor", self.address, str(self.jars_dir)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        return started

    def hanging_transactions(self, older_than_min: int = 1) -> list[tuple[str, int, int]]:
        """(topic, partition, start offset) of each transaction open for over ``older_than_min`` minutes on a
        partition whose coordinator no longer expects to write its markers (``kafka-transactions.sh find-hanging``).

        A single broker killed mid-commit may, once restarted, finish the transaction at its coordinator without
        writing the markers to its partitions (still fenced, it does not know itself as their leader and skips
        them as deleted: "Couldn't find leader endpoint" in its log; seen here under kill -9). The partitions'
        last stable offset then stays put: read_committed readers, and offset fetches of the group whose offsets
        were in the transaction, wait forever. Only a transaction older than any live one can be (ours commit
        within seconds) is taken for hanging, so a live transaction is never aborted.
        """
        output = self._run_tool(
            _TRANSACTIONS_TOOL,
            "--bootstrap-server",
            self.address,
            "find-hanging",
            "--broker-id",
            str(self.node_id),
            "--max-transaction-timeout",
            str(older_than_min),
        )
        return parse_hanging_transactions(output)

    def abort_transaction(self, topic: str, partition: int, start_offset: int) -> None:
        """Abort the transaction open on ``topic``-``partition`` since ``start_offset`` (``kafka-transactions.sh abort``):
        its records stay invisible, and offsets it committed for a group are dropped, so that input is consumed again."""
        self._run_tool(
            _TRANSACTIONS_TOOL,
            "--bootstrap-server",
            self.address,
            "abort",
            "--topic",
            topic,
            "--partition",
            str(partition),
            "--start-offset",
            str(start_offset),
        )

    def ready(self) -> bool:
        """A metadata request answered by this broker, and a group coordinator that serves groups.

        Right after a first start the metadata answers before ``__consumer_offsets`` is loaded;
        consumers committing offsets then get NOT_COORDINATOR, so that counts as not ready yet.
        """
        # log_level 0: a broker that is still starting is expected, not worth a log line per poll.
        admin = AdminClient({"bootstrap.servers": self.address, "socket.timeout.ms": 1000, "log_level": 0})
        try:
            if self.node_id not in admin.list_topics(timeout=1.0).brokers:
                return False
            admin.describe_consumer_groups([_READINESS_GROUP], request_timeout=1.0)[_READINESS_GROUP].result()
        except KafkaException:
            return False
        return True

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.cluster_id_file.unlink(missing_ok=True)
