"""The stack's Redis Cluster: masters and their replicas, each a cluster-mode redis-server, formed once with
``redis-cli --cluster create`` (the nodes remember the cluster in their nodes.conf across stop/start)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from infra.errors import StackError
from infra.jars import require_tool
from infra.redis import RedisServer
from infra.service import ServiceGroup, wait_until

_WIPE_FIX = "run `loopline stack down --wipe` (deletes the online store's data) and `loopline stack up` again"


class RedisCluster(ServiceGroup):
    """``masters`` × (1 + ``replicas``) nodes on ``host``: node i (from 0) listens on ``port + i``, its cluster bus on
    ``bus_port + i``. ``redis-cli`` picks which nodes are masters and which replicate which; a replica takes over when
    its master has not answered for ``node_timeout_ms``."""

    def __init__(
        self,
        masters: int,
        replicas: int,
        host: str,
        port: int,
        bus_port: int,
        data_dir: Path,
        run_dir: Path,
        log_dir: Path,
        node_timeout_ms: int = 5_000,
        start_timeout_s: float = 20.0,
    ) -> None:
        self.replicas, self.start_timeout_s = replicas, start_timeout_s
        self.nodes = tuple(
            RedisServer(
                host,
                port + i,
                data_dir,
                run_dir,
                log_dir,
                start_timeout_s,
                node_id=i + 1,
                bus_port=bus_port + i,
                node_timeout_ms=node_timeout_ms,
            )
            for i in range(masters * (1 + replicas))
        )

    def start(self) -> bool:
        """Start every node that is not running, form the cluster if its nodes are new, and wait until every node
        reports the cluster ok and every replica is in sync with its master. True if any process was started."""
        started = self.start_all()
        new = [_cluster_info(node)["cluster_known_nodes"] == "1" for node in self.nodes]
        if all(new):
            self._create()
        elif any(new):
            lone = ", ".join(node.name for node, alone in zip(self.nodes, new, strict=True) if alone)
            raise StackError(f"Redis nodes {lone} belong to no cluster while the others form one", _WIPE_FIX)
        if not wait_until(self.healthy, self.start_timeout_s):
            states = ", ".join(f"{node.name}: {_cluster_info(node).get('cluster_state', '?')}" for node in self.nodes)
            raise StackError(
                f"the Redis Cluster is not ok within {self.start_timeout_s:.0f} s ({states})",
                f"see the nodes' logs ({self.nodes[0].log_file.parent}/redis-*.log), or {_WIPE_FIX}",
            )
        return started

    def healthy(self) -> bool:
        """Whether every node runs and reports ``cluster_state:ok``, and every replica's link to its master is up."""
        try:
            return all(_cluster_info(node).get("cluster_state") == "ok" for node in self.nodes) and all(
                role[0] == b"master" or role[3] == b"connected" for role in (node.query("ROLE") for node in self.nodes)
            )
        except (redis.RedisError, OSError):
            return False

    def _create(self) -> None:
        """``redis-cli --cluster create``: the slots spread over the masters, ``replicas`` replicas for each."""
        command = [
            require_tool("redis-cli", "redis-tools"),
            "--cluster",
            "create",
            *(node.address for node in self.nodes),
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=self.start_timeout_s)
        if done.returncode != 0:
            last = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise StackError(f"`redis-cli --cluster create` failed: {last}", _WIPE_FIX)


def _cluster_info(node: RedisServer) -> dict[str, str]:
    """A node's ``CLUSTER INFO`` (``cluster_state``, ``cluster_known_nodes``, ...)."""
    text = node.query("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else text
    return dict(line.split(":", 1) for line in text.split() if ":" in line)
