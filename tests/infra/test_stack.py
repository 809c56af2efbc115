"""The local stack: idempotent up, data kept across down/up, --wipe, and one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from infra.errors import StackError
from infra.flink import check_connector_matches
from infra.jars import require_tool
from infra.prometheus_server import RULES_DIR
from infra.service import free_port_block, wait_until
from infra.stack import LocalStack
from loopline.components import build_stack
from loopline.settings import STACK_SHAPE_FILE, Settings, settings_environment
from schemas.topics import DAY_MS, TopicSpec
from streams.topics import apply_topics, topic_sizes
from tests.support.paths import REPO
from tests.support.stack import stack_settings
from tests.support.templates import TransactionEvent

#: The integration tier: stacks of its own, started and stopped by its tests.
pytestmark = pytest.mark.stack

PROBE = TopicSpec("test.persistence", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)


def test_up_twice_is_a_no_op(stack: LocalStack) -> None:
    pids = {status.name: status.pid for status in stack.status()}
    reports = stack.up()
    assert [report.started for report in reports] == [False] * len(stack.services)
    assert {status.name: status.pid for status in stack.status()} == pids
    assert all(status.state == "ready" for status in stack.status())


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[tuple[LocalStack, Settings]]:
    """A second, private stack that this test may stop, restart and wipe."""
    settings = stack_settings(tmp_path)
    local = build_stack(settings)
    local.up()
    yield local, settings
    local.down(wipe=True)


def _write_probe_data(settings: Settings) -> None:
    apply_topics(settings.kafka.bootstrap, [PROBE])
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap})
    for i in range(10):
        producer.produce(PROBE.name, f"value-{i}".encode(), f"key-{i}".encode())
    assert producer.flush(10) == 0
    redis.Redis(port=settings.redis.port).set("probe", "kept")


def test_prometheus_scrapes_every_loopline_process_and_loads_the_alert_rules(stack: LocalStack, settings: Settings) -> None:
    api = f"{stack.prometheus.address}/api/v1"

    def jobs() -> set[str]:
        return {t["labels"]["job"] for t in requests.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]}

    # Prometheus lists its targets a few seconds after it answers /-/ready (its scrape manager starts after the API).
    expected = {"loopline-scorer", "loopline-monitor", "loopline-feature-job", "loopline-joiner"}
    assert wait_until(lambda: jobs() == expected, 30, 0.5), jobs()

    def groups() -> list[dict]:
        return requests.get(f"{api}/rules", timeout=5).json()["data"]["groups"]

    rule_files = {Path(group["file"]).name for group in groups()}
    assert rule_files == {path.name for path in RULES_DIR.glob("*.rules.yml")} and len(rule_files) >= 2
    # Every rule evaluates (a rule naming a label Prometheus cannot parse, or a bad function, shows as "err").
    assert wait_until(lambda: all(rule["health"] == "ok" for group in groups() for rule in group["rules"]), 30, 0.5), groups()

    # A second `stack up` rewrites the running Prometheus' config and reloads it (a new target shows).
    prometheus = stack.prometheus
    original = dict(prometheus.targets)
    try:
        prometheus.targets = {**original, "probe": ["127.0.0.1:9"]}
        assert prometheus.start() is False
        assert wait_until(lambda: "probe" in jobs(), 20, 0.5)
    finally:
        prometheus.targets = original
        prometheus.start()


def test_down_then_up_keeps_topics_and_data(scratch: tuple[LocalStack, Settings]) -> None:
    local, settings = scratch
    _write_probe_data(settings)
    assert sorted(local.down()) == ["jaeger", "kafka", "prometheus", "redis"]
    assert {s.name: s.state for s in local.status()[:4]} == dict.fromkeys(["kafka", "redis", "prometheus", "jaeger"], "stopped")
    assert [report.started for report in local.up()] == [True] * 4
    assert topic_sizes(settings.kafka.bootstrap, [PROBE.name]) == {PROBE.name: 10}
    assert redis.Redis(port=settings.redis.port).get("probe") == b"kept"


def test_wipe_deletes_topics_and_data(scratch: tuple[LocalStack, Settings]) -> None:
    local, settings = scratch
    _write_probe_data(settings)
    local.down(wipe=True)
    local.up()
    assert topic_sizes(settings.kafka.bootstrap, [PROBE.name]) == {}
    assert redis.Redis(port=settings.redis.port).get("probe") is None


def test_port_clash_is_a_one_line_error(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.redis.port))
        squatter.listen()
        with pytest.raises(StackError) as caught:
            build_stack(settings).redis.start()
    message = str(caught.value)
    assert f"port {settings.redis.port}" in message and "fix:" in message and "\n" not in message


def test_cli_prints_one_line_not_a_trace(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path)
    env = {
        **os.environ,
        "LOOPLINE_HOME": str(tmp_path),
        "LOOPLINE_JARS_DIR": str(settings.resolved_jars_dir),
        "LOOPLINE_KAFKA__PORT": str(settings.kafka.port),
    }
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.kafka.port))
        squatter.listen()
        result = subprocess.run(
            [sys.executable, "-c", "from loopline.cli import main; main()", "stack", "up"],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: port")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_stale_kafka_data_dir_is_refused(tmp_path: Path) -> None:
    kafka = build_stack(stack_settings(tmp_path)).kafka.nodes[0]
    kafka.data_dir.mkdir(parents=True)
    (kafka.data_dir / "meta.properties").write_text("version=1\ncluster.id=SomeOtherCluster\nnode.id=1\n")
    with pytest.raises(StackError, match=r"stale Kafka data dir.*SomeOtherCluster.*--wipe"):
        kafka.start()
    assert kafka.pid() is None


def test_missing_tool_names_the_package() -> None:
    with pytest.raises(StackError, match="apt-get install some-package"):
        require_tool("surely-not-installed-anywhere", "some-package")


def test_flink_connector_must_match_pyflink() -> None:
    check_connector_matches("2.2.1", "5.0.0-2.2")
    with pytest.raises(StackError, match=r"built for Flink 2\.2, but PyFlink is 2\.1\.0"):
        check_connector_matches("2.1.0", "5.0.0-2.2")


def test_stack_up_starts_a_kafka_cluster_that_later_commands_see(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path)
    base = free_port_block(6)
    # No replication setting: `topics apply` takes it from the shape `stack up` remembered.
    env = settings_environment(settings, LOOPLINE_KAFKA__PORT=str(base), LOOPLINE_KAFKA__CONTROLLER_PORT=str(base + 1))

    def loopline(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-c", "from loopline.cli import main; main()", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        return result

    loopline("stack", "up", "--kafka-brokers", "3")
    try:
        status = loopline("stack", "status").stdout
        rows = {line.split("│")[1].strip(): line for line in status.splitlines() if line.count("│") > 2}
        assert all("ready" in rows[f"kafka-{node}"] for node in (1, 2, 3)), status
        created = loopline("topics", "apply").stdout
        assert "× 3 replicas" in created, created
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{base + 2}"})
        topics = admin.list_topics(timeout=10).topics
        assert all(len(p.replicas) == 3 for p in topics["events.transactions"].partitions.values())
        resource = ConfigResource(ConfigResource.Type.TOPIC, "events.transactions")
        configs = admin.describe_configs([resource])[resource].result(timeout=10)
        assert configs["min.insync.replicas"].value == "2", "the 3-node shape's min ISR"
        one_node = {**env, "LOOPLINE_KAFKA__REPLICATION_FACTOR": "1", "LOOPLINE_KAFKA__MIN_INSYNC_REPLICAS": "1"}
        refused = subprocess.run(
            [sys.executable, "-c", "from loopline.cli import main; main()", "stack", "up", "--kafka-brokers", "1"],
            capture_output=True,
            text=True,
            env=one_node,
            cwd=REPO,
            timeout=120,
        )
        # Typer boxes and wraps the message: compare its words.
        words = " ".join(refused.stderr.replace("│", " ").split())
        assert refused.returncode != 0 and "holds the data of 3 node(s)" in words and "stack down --wipe" in words, words
        too_many = subprocess.run(
            [sys.executable, "-c", "from loopline.cli import main; main()", "config"],
            capture_output=True,
            text=True,
            env={**env, "LOOPLINE_KAFKA__BROKERS": "2", "LOOPLINE_KAFKA__REPLICATION_FACTOR": "3"},
            cwd=REPO,
            timeout=120,
        )
        assert too_many.returncode == 1 and "Traceback" not in too_many.stderr, too_many.stderr
        assert "replication_factor 3 needs as many brokers" in too_many.stderr and len(too_many.stderr.strip().splitlines()) == 1
    finally:
        stopped = loopline("stack", "down", "--wipe").stdout
    assert all(f"kafka-{node}" in stopped for node in (1, 2, 3)), stopped
    assert not (tmp_path / STACK_SHAPE_FILE).exists(), "the wiped stack's shape is forgotten"
