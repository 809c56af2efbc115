"""Redis from Debian's ``redis-server``, with append-only persistence so data survives stop/start."""

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
    """A local redis-server: the online store Feast writes features into."""

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
    ) -> None:
        super().__init__(run_dir, log_dir, start_timeout_s)
        self.host, self.port = host, port
        self.data_dir = data_dir / "redis"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        return {"listener": (self.host, self.port)}

    def version(self) -> str:
        binary = shutil.which("redis-server")
        return _server_version(binary) if binary else "not installed"

    def command(self) -> list[str]:
        return [
            require_tool("redis-server", "redis-server"),
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--daemonize", "no",
            "--save", "",
            "--protected-mode", "no",
        ]  # fmt: skip

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        """A real PING answered with PONG."""
        try:
            return bool(redis.Redis(host=self.host, port=self.port, socket_timeout=1.0).ping())
        except redis.RedisError:
            return False

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
