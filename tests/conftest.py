"""The real local stack for the tests: its own ports and data dir, started once per session."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.stack import LocalStack
from loopline.components import build_stack
from loopline.settings import KafkaSettings, RedisSettings, Settings
from schemas.topics import TOPICS
from streams.topics import apply_topics

REPO = Path(__file__).resolve().parents[1]
#: The jar cache is shared with `make setup`, so tests do not fetch from Maven Central again.
JARS_DIR = REPO / ".loopline" / "jars"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stack_settings(home: Path) -> Settings:
    """Settings for a private stack under ``home`` on free ports."""
    return Settings(
        home=home,
        jars_dir=JARS_DIR,
        kafka=KafkaSettings(port=free_port(), controller_port=free_port()),
        redis=RedisSettings(port=free_port()),
    )


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return stack_settings(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[LocalStack]:
    """Kafka + Redis up for the whole session, Loopline's topics applied; stopped at the end."""
    local = build_stack(settings)
    local.setup()
    local.up()
    apply_topics(settings.kafka.bootstrap_servers, TOPICS)
    yield local
    local.down(wipe=True)


@pytest.fixture(scope="session")
def bootstrap(stack: LocalStack, settings: Settings) -> str:
    return settings.kafka.bootstrap_servers

