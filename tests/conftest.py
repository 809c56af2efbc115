"""The real local stack for the tests: its own ports and data dir, started once per session."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition

from feature_store.config import apply_definitions
from infra.errors import StackError
from infra.helm_chart import render
from infra.helm_tool import helm_binary
from infra.service import free_port, wait_until
from infra.stack import LocalStack
from loopline.components import apply_loopline_topics, build_stack, private_stack_settings
from loopline.project import init_project
from loopline.scenarios.fault_drill import DrillReport
from loopline.serving import doors_in_thread
from loopline.settings import Settings
from online.scorer import Scorer
from schemas.records import ScoreRequest
from schemas.topics import SCORE_REQUESTS
from schemas.validation import R, decode, encode
from streams.world import Emitted

REPO = Path(__file__).resolve().parents[1]
#: The key of records a test writes as junk on purpose (bytes that are not the topic's contract, to show a reader
#: survives them). Topics are shared by the session's tests: `LogReader` leaves these out, and nothing else.
JUNK_KEY = b"junk"
#: The jar cache is shared with `make setup`, so tests do not fetch from Maven Central again.
JARS_DIR = REPO / ".loopline" / "jars"
#: The CRDs the chart's custom resources are validated against (the shared folder beside the repository).
CRDS = REPO.parent / "shared" / "crds"
#: The chart's values sets: its small default, and production layered over it.
CHART_VALUES = {"default": ["values.yaml"], "production": ["values.yaml", "values-production.yaml"]}


class LogReader:
    """Reads a topic from its beginning (or, ``from_end``, from what is produced after it starts) as a read_committed
    consumer, keeping what it has seen."""

    def __init__(self, bootstrap: str, topic: str, from_end: bool = False) -> None:
        group = f"reader-{uuid.uuid4()}"
        if from_end:  # a test racing a fast writer must not first wade through every earlier test's records
            start_group_at_end(bootstrap, group, topic)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self.consumer.subscribe([topic])
        self.values: list[bytes] = []
        self._decoded: dict[type, list] = {}

    def poll(self) -> list[bytes]:
        """Everything read so far, after one more fetch, less the records keyed `JUNK_KEY`."""
        fetched = self.consumer.consume(5000, timeout=0.2)
        self.values += [m.value() for m in fetched if m.error() is None and m.key() != JUNK_KEY]
        return self.values

    def records(self, record_type: type[R]) -> list[R]:
        """Everything read so far, decoded as ``record_type``: a record that breaks the contract fails the test. Each
        record is decoded once (a wait that polls this over a topic of 100,000 records would otherwise spend its time
        decoding the same records again)."""
        values, decoded = self.poll(), self._decoded.setdefault(record_type, [])
        decoded += [decode(record_type, value) for value in values[len(decoded) :]]
        return list(decoded)

    def close(self) -> None:
        self.consumer.close()


def score_request(user: str, amount: float) -> dict:
    """A score request (as JSON-ready data) for ``user`` with the request field ``amount``, a fresh id."""
    return ScoreRequest(
        schema_version=ScoreRequest.SCHEMA_VERSION,
        request_id=str(uuid.uuid4()),
        entity_keys={"user_id": user},
        request_fields={"amount": amount},
        requested_at_ms=int(time.time() * 1000),
    ).model_dump()


def score_requests(users: list[str], rate_per_s: float, run_id: str) -> Iterator[Emitted]:
    """Score requests ``<run_id>-<n>`` for ``users`` in turn (``score_request``'s, amounts from a few), paced at
    ``rate_per_s`` (each stamped as it is drawn, i.e. as the producer sends it): a load on the Kafka door."""
    emit_at_ms = time.time() * 1000
    for n in itertools.count():
        emit_at_ms += 1000 / rate_per_s
        request = ScoreRequest(**{**score_request(users[n % len(users)], float(10 + n % 300)), "request_id": f"{run_id}-{n}"})
        yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), int(emit_at_ms), request)


def stack_settings(home: Path, project: Path | None = None) -> Settings:
    """Settings for a private stack under ``home`` on free ports, acting on ``project`` (default: a fraud project made
    under ``home``)."""
    return private_stack_settings(home, JARS_DIR, project or init_project(home / "project", "fraud"))


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


@pytest.fixture(scope="session")
def delivery_applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A second stack, acting on a delivery project (the session's own acts on fraud): started when a test first asks
    for it, its topics and Feast definitions applied, stopped at the session's end."""
    home = tmp_path_factory.mktemp("delivery-stack")
    settings = stack_settings(home, init_project(home / "project", "delivery"))
    local = build_stack(settings)
    local.setup()
    local.up()
    try:
        apply_loopline_topics(settings)
        apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        yield settings
    finally:
        local.down(wipe=True)


def start_group_at_end(bootstrap: str, group: str, topic: str) -> None:
    """Commit ``group``'s offsets at the end of ``topic``: it sees only what is produced from now on."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = [TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]) for p in partitions]
    consumer.commit(offsets=ends, asynchronous=False)
    consumer.close()


@contextmanager
def serving_doors(
    settings: Settings,
    scorer: Scorer,
    install_models: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    kafka: bool = False,
) -> Iterator[tuple[str, str]]:
    """The scorer's HTTP and gRPC doors (and with ``kafka``, its Kafka door as a new consumer group that
    starts at the end of ``scoring.requests``) on free ports, on one event loop in a thread:
    (http url, grpc address). ``install_models(stop)`` runs beside them (see ``run_doors``)."""
    serving = {"http_port": free_port(), "grpc_port": free_port(), "kafka_group_id": f"doors-{uuid.uuid4().hex[:8]}"}
    settings = settings.model_copy(update={"serving": settings.serving.model_copy(update=serving)})
    if kafka:
        start_group_at_end(settings.kafka.bootstrap, settings.serving.kafka_group_id, SCORE_REQUESTS.name)
    url = f"http://127.0.0.1:{settings.serving.http_port}"

    def up() -> bool:
        try:
            return requests.get(f"{url}/v1/health/live", timeout=1).ok
        except requests.ConnectionError:
            return False

    with doors_in_thread(settings, scorer, {"http", "grpc", "kafka"} if kafka else {"http", "grpc"}, install_models):
        assert wait_until(up, 20, 0.05), "the doors did not start"
        yield url, f"127.0.0.1:{settings.serving.grpc_port}"


def assert_the_drill_lost_nothing(report: DrillReport, kinds: Iterable[str]) -> None:
    """What every fault drill promises (``loopline/scenarios/fault_drill.py``): each fault of ``kinds`` injected and
    recovered from, every Kafka request with exactly one prediction, the features equal to the recompute, every
    process live."""
    assert sorted(f.kind for f in report.faults) == sorted(kinds)
    assert all(f.recovered_s is not None for f in report.faults), f"a part did not recover: {report.faults}"
    assert report.requests_sent > 1_000
    assert (report.requests_lost, report.requests_duplicated) == (0, 0), "every Kafka request has exactly one prediction"
    assert report.entities_compared > 500 and report.feature_mismatches == [], report.feature_mismatches[:5]
    assert report.not_live == [], "every process is up and live"
