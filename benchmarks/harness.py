"""What every benchmark here needs: settings for a private stack on free local ports, and percentiles."""

from __future__ import annotations

import socket
from pathlib import Path

from loopline.settings import KafkaSettings, RedisSettings, Settings

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def private_settings(home: Path) -> Settings:
    """Settings for a stack of the benchmark's own under ``home`` (Kafka and Redis on free ports; the jar cache shared)."""
    return Settings(
        home=home,
        jars_dir=REPO / ".loopline" / "jars",
        kafka=KafkaSettings(port=free_port(), controller_port=free_port()),
        redis=RedisSettings(port=free_port()),
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
