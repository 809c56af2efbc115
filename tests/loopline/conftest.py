"""The fixtures of the tests of ``loopline/`` alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopline.project import init_project
from loopline.settings import Settings
from tests.support.stack import private_stack, stack_settings


@pytest.fixture(scope="session")
def delivery_applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A second stack, acting on a delivery project (the session's own acts on fraud): started when a test first asks
    for it, its topics and Feast definitions applied, stopped at the session's end."""
    home = tmp_path_factory.mktemp("delivery-stack")
    settings = stack_settings(home, init_project(home / "project", "delivery"))
    with private_stack(settings):
        yield settings
