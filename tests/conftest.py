"""What several test folders share: the real local stack (its own ports and data dir, started once per session), the
rendered Helm chart, and the two tiers.

The tiers (tests/README.md): a test that asks for a stack fixture (``STACK_FIXTURES``, directly or through another
fixture) is marked ``stack``, and a module that starts services of its own says so with ``pytestmark =
pytest.mark.stack``. A test marked neither ``stack`` nor ``images`` fails the moment it starts a service, so a test in
the wrong tier is caught in either run, ``make test-fast`` or ``make test``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from feature_store.config import apply_definitions
from infra.errors import StackError
from infra.helm_chart import render
from infra.helm_tool import helm_binary
from infra.service import ManagedService
from infra.stack import LocalStack
from loopline.components import apply_loopline_topics, build_stack
from loopline.settings import Settings
from tests.support.paths import CHART_VALUES
from tests.support.stack import stack_settings

#: The session's fixtures that stand for a running stack.
STACK_FIXTURES = frozenset({"stack", "bootstrap", "applied", "delivery_applied"})
#: The markers of the tiers that may start services.
SERVICE_TIERS = ("stack", "images")
#: The test being run (its setup, call and teardown), for the guard below.
_running: dict[str, pytest.Item] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if STACK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)


@pytest.fixture(scope="session", autouse=True)
def services_only_in_their_tiers() -> Iterator[None]:
    """Starting a service (Kafka, Redis, Prometheus, Jaeger, a Flink cluster: every ``ManagedService``) from a test
    marked neither ``stack`` nor ``images`` fails that test, naming the marker it lacks."""
    launch = ManagedService.launch

    def guarded(service: ManagedService):
        item = _running.get("item")
        if item is not None and not any(item.get_closest_marker(tier) for tier in SERVICE_TIERS):
            pytest.fail(
                f"{item.nodeid} starts {type(service).__name__} but is not marked `stack`: ask for a stack fixture or "
                "set `pytestmark = pytest.mark.stack` in its module (tests/README.md)",
                pytrace=False,
            )
        return launch(service)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ManagedService, "launch", guarded)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running["item"] = item
    try:
        return (yield)
    finally:
        _running.pop("item", None)


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The session's stack, acting on a fraud project made from the template (``loopline init``)."""
    return stack_settings(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[LocalStack]:
    """Kafka + Redis up for the whole session, Loopline's topics applied; stopped at the end."""
    local = build_stack(settings)
    local.setup()
    local.up()
    apply_loopline_topics(settings)
    yield local
    local.down(wipe=True)


@pytest.fixture(scope="session")
def bootstrap(stack: LocalStack, settings: Settings) -> str:
    return settings.kafka.bootstrap


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm, from the tools folder of Settings().home (where `loopline stack setup` builds it) or PATH."""
    try:
        return helm_binary(Settings().home.absolute() / "tools")
    except StackError as err:
        pytest.skip(f"no helm to render the chart with: {err}")


@pytest.fixture(scope="session")
def rendered(helm: Path) -> dict[str, list[dict]]:
    """The chart rendered once per values set of ``CHART_VALUES`` (shared: a test copies an object it changes)."""
    return {name: render(files, helm=helm) for name, files in CHART_VALUES.items()}


@pytest.fixture(scope="session")
def applied(settings: Settings, stack: LocalStack) -> Settings:
    """The settings, with the Feast definitions applied to the stack's registry and Redis."""
    apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    return settings
