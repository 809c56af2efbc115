"""A private stack's settings: its own ports and data dir, for a test that starts a stack of its own (or the
session's, ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

from loopline.components import private_stack_settings
from loopline.project import init_project
from loopline.settings import Settings
from tests.support.paths import JARS_DIR


def stack_settings(home: Path, project: Path | None = None) -> Settings:
    """Settings for a private stack under ``home`` on free ports, acting on ``project`` (default: a fraud project made
    under ``home``)."""
    return private_stack_settings(home, JARS_DIR, project or init_project(home / "project", "fraud"))
