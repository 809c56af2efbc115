"""Kafka as a three-node cluster, each node on a host of its own (a network namespace, ``infra/netns.py``): topics
replicated three times with two in sync for a write, and under load (the feature job, a Kafka-door scorer, an HTTP
scorer whose answers wait for their logged prediction) one node killed with -9 and, separately, one cut off the
network (``loopline/scenarios/fault_drill.py``), the feedback joiner joining each request's label: nothing lost or
doubled, no transaction left open, every process up, the cluster back to every replica in sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from feature_store.config import apply_definitions
from infra.kafka_cluster import KafkaCluster
from infra.netns import NetworkNamespaces
from infra.service import wait_until
from loopline.components import apply_loopline_topics, build_stack
from loopline.scenarios.fault_drill import BROKER_FAULTS, FaultDrill
from loopline.settings import Settings
from schemas.topics import TOPICS
from tests.support.drill import TRIMMED, assert_the_drill_lost_nothing
from tests.support.paths import JARS_DIR
from tests.support.stack import stack_settings

#: The integration tier: a three-node Kafka cluster of its own.
pytestmark = pytest.mark.stack

BROKERS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, KafkaCluster, NetworkNamespaces]]:
    """Three Kafka nodes on hosts of their own and a Redis; settings naming that cluster (3 replicas, 2 in sync)."""
    home = tmp_path_factory.mktemp("kafka-cluster")
    local = stack_settings(home)
    with NetworkNamespaces(BROKERS) as network:
        kafka = KafkaCluster(
            BROKERS,
            network.addresses,
            9092,
            9093,
            local.resolved_data_dir,
            JARS_DIR,
            local.run_dir,
            local.resolved_logs_dir,
            local.kafka.heap_mb,
            local.kafka.start_timeout_s,
            launchers=[network.command(i, []) for i in range(BROKERS)],
        )
        cluster_kafka = {"bootstrap_servers": kafka.bootstrap.split(","), "replication_factor": 3, "min_insync_replicas": 2}
        settings = local.model_copy(
            update={"kafka": type(local.kafka).model_validate({**local.kafka.model_dump(), **cluster_kafka})}
        )
        redis = build_stack(settings).redis
        try:
            kafka.start()
            redis.start()
            apply_loopline_topics(settings)
            apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
            yield settings, kafka, network
        finally:
            # The cluster's data goes with the test's temporary folder: no clean shutdown is needed.
            redis.stop(grace_s=0)
            kafka.stop(grace_s=0)


def test_topics_are_replicated_on_every_node(cluster: tuple[Settings, KafkaCluster, NetworkNamespaces]) -> None:
    settings, kafka, _ = cluster
    topics = AdminClient({"bootstrap.servers": settings.kafka.bootstrap}).list_topics(timeout=10).topics
    for spec in TOPICS:
        partitions = topics[spec.name].partitions.values()
        assert len(partitions) == spec.partitions
        assert all(sorted(p.replicas) == [1, 2, 3] and sorted(p.isrs) == [1, 2, 3] for p in partitions), spec.name
    # Leadership is spread: a node's loss moves some partitions, not all.
    assert len({p.leader for name in (spec.name for spec in TOPICS) for p in topics[name].partitions.values()}) == BROKERS
    # Internal topics (offsets, transactions) are made on first use: their replicas join the ISR a moment later.
    assert wait_until(lambda: kafka.under_replicated() == 0, 60, 0.5), kafka.under_replicated()


@pytest.mark.timeout(900)
def test_a_node_killed_or_cut_off_under_load_loses_nothing(
    cluster: tuple[Settings, KafkaCluster, NetworkNamespaces], tmp_path: Path
) -> None:
    settings, kafka, network = cluster
    drill = FaultDrill(
        settings, tmp_path, kinds=BROKER_FAULTS, kafka=kafka, network=network, joiner=True, on_progress=print, **TRIMMED
    )
    report = drill.run()
    figures = report.figures()
    print(figures)
    assert_the_drill_lost_nothing(report, BROKER_FAULTS)
    answered = sum(a.status == 200 for a in report.http_answers)
    assert answered > 100 and (report.http_predictions_lost, report.http_predictions_duplicated) == (0, 0), figures
    assert (report.examples_lost, report.examples_duplicated) == (0, 0), (
        f"every labeled request has exactly one example: {figures}"
    )
    assert report.open_transactions == [], "no transaction left open"
    assert kafka.hanging_transactions() == []
    assert all(f.full_isr_s is not None for f in report.faults), f"every replica back in sync after each fault: {report.faults}"
    # Two nodes of three keep the cluster writable: the Kafka door stalls for the fault's transactions, then scores on.
    assert all(f.stall_s is not None and f.stall_s < 60 for f in report.faults), f"predictions stalled a minute: {report.faults}"
    assert all(node.pid() is not None for node in kafka.nodes), "every node is up"
