"""A private stack: its settings (its own ports and data dir, for a test that starts a stack of its own, or the
session's, ``tests/conftest.py``) and its life (up with Loopline's topics and the project's Feast definitions, wiped
at the end)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from feature_store.config import apply_definitions
from loopline.components import apply_loopline_topics, build_stack, private_stack_settings
from loopline.project import init_project
from loopline.settings import Settings
from tests.support.paths import JARS_DIR


def stack_settings(home: Path, project: Path | None = None) -> Settings:
    """Settings for a private stack under ``home`` on free ports, acting on ``project`` (default: a fraud project made
    under ``home``)."""
    return private_stack_settings(home, JARS_DIR, project or init_project(home / "project", "fraud"))


@contextmanager
def private_stack(settings: Settings) -> Iterator[Settings]:
    """The stack of ``settings`` set up and started, Loopline's topics and the project's Feast definitions applied;
    stopped and wiped on leaving (its data is the test's alone)."""
    stack = build_stack(settings)
    stack.setup()
    stack.up()
    try:
        apply_loopline_topics(settings)
        apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        yield settings
    finally:
        stack.down(wipe=True)
