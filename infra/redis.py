"""Redis from Debian's ``redis-server``, with append-only persistence so data survives stop/start: the stack's only
server, or one node of its Redis Cluster (``infra/redis_cluster.py``)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import redis

from infra.jars import require_tool
from infra.service import ManagedService


@cache
def _server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return next((part.split("=", 1)[1] for part in out.split() if part.startswith("v=")), "unknown")


class RedisServer(ManagedService):
    """A local redis-server: the online store Feast writes features into.

    As node ``node_id`` of a cluster (named ``redis-<node_id>``) it runs with cluster mode on, its cluster bus on
    ``bus_port``, and is failed over to a replica once it has not answered its peers for ``node_timeout_ms``.
    """

    name = "redis"
    cmdline_marker = "redis-server"

    def __init__(
        self,
        host: str,
        port: int,
        data_dir: Path,
        run_dir: Path,
        log_dir: Path,
        start_timeout_s: float = 20.0,
        node_id: int | None = None,
        bus_port: int | None = None,
        node_timeout_ms: int = 5_000,
    ) -> None:
        if node_id is not None:
            self.name = f"redis-{node_id}"
        super().__init__(run_dir, log_dir, start_timeout_s)
        self.host, self.port = host, port
        self.node_id, self.bus_port, self.node_timeout_ms = node_id, bus_port, node_timeout_ms
        self.data_dir = data_dir / self.name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        bus = {} if self.node_id is None else {"cluster bus": (self.host, self.bus_port)}
        return {"listener": (self.host, self.port), **bus}

    def version(self) -> str:
        binary = shutil.which("redis-server")
        return _server_version(binary) if binary else "not installed"

    def command(self) -> list[str]:
        return [
            require_tool("redis-server", "redis-server"),
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--daemonize",
            "no",
            "--save",
            "",
            "--protected-mode",
            "no",
            *self._cluster_options(),
        ]

    def _cluster_options(self) -> list[str]:
        if self.node_id is None:
            return []
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in --dir: the node keeps its cluster across restarts
            "--cluster-port",
            str(self.bus_port),  # explicit: the default, port + 10000, may exceed 65535
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # A failed master costs only its own slots' keys: the other masters keep answering meanwhile.
            "--cluster-require-full-coverage",
            "no",
        ]

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        """A real PING answered with PONG."""
        try:
            return bool(self.query("PING"))
        except redis.RedisError:
            return False

    def query(self, *command: str):
        """This node's reply to one command (raises redis.RedisError when it does not answer within a second)."""
        with redis.Redis(host=self.host, port=self.port, socket_timeout=1.0) as client:
            return client.execute_command(*command)

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
