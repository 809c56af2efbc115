"""The real local stack for the tests: its own ports and data dir, started once per session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from infra.stack import LocalStack
from loopline.components import build_stack, private_stack_settings
from loopline.settings import Settings
from schemas.topics import TOPICS
from streams.topics import apply_topics

REPO = Path(__file__).resolve().parents[1]
#: The jar cache is shared with `make setup`, so tests do not fetch from Maven Central again.
JARS_DIR = REPO / ".loopline" / "jars"


class LogReader:
    """Reads a topic from its beginning as a read_committed consumer, keeping what it has seen."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})  # fmt: skip
        self.consumer.subscribe([topic])
        self.values: list[bytes] = []

    def poll(self) -> list[bytes]:
        """Everything read so far, after one more fetch."""
        self.values += [m.value() for m in self.consumer.consume(5000, timeout=0.2) if m.error() is None]
        return self.values

    def close(self) -> None:
        self.consumer.close()


def stack_settings(home: Path) -> Settings:
    """Settings for a private stack under ``home`` on free ports."""
    return private_stack_settings(home, JARS_DIR)


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

