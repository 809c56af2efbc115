"""Redis Cluster as the online store: three masters and three replicas of this module's own (the stack's
``redis.mode: cluster``), Feast's ``redis_type: redis_cluster``, the fast read path, the result cache and the real
feature job on it; and a master killed with ``kill -9`` under load, its replica frozen behind it: the replica takes over,
reads meanwhile are answered on defaults within the budget, then fresh again, and no row the job counted as written
(acknowledged by a replica) is lost.

Real redis-server nodes (formed by ``redis-cli --cluster create``), Feast, Kafka and Flink; the session's Kafka.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pandas as pd
import pytest
import redis

from feature_store.config import apply_definitions, feature_fields, feature_store
from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter, ReplicaAckError
from feature_store.settings import FeatureStoreSettings, RedisSettings
from infra.redis_cluster import RedisCluster
from infra.service import free_port_block, wait_until
from loopline.components import build_stack
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings
from online.features import FeatureFetcher
from online.result_cache import ResultCache
from schemas import DeadLetterRecord
from schemas.topics import DAY_MS, TopicSpec
from streams.feature_plan import compile_plan
from streams.flink_job import latest_checkpoint
from streams.producer import EventProducer
from streams.recompute import accepted_events, feature_differences, recompute
from streams.topics import apply_topics, read_topic
from streams.world import Emitted
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent, fraud_world

#: The integration tier: a Redis Cluster of its own.
pytestmark = pytest.mark.stack

USER_VIEW, MERCHANT_VIEW = "user_transaction_features", "merchant_transaction_features"
#: Short, so a master's failure is noticed (and its replica promoted) within a couple of seconds.
NODE_TIMEOUT_MS = 1_000
BUDGET_S = 0.020
#: What two busy cores may add to an answer on top of the budget (the fault drill's allowance).
SLACK_S = 0.025
#: An answer later than this would have hung on Redis, not merely waited for the cores (at load average 17 on 2 cores a
#: few over-budget answers took 50-56 ms).
HANG_S = 0.25
SOURCE = TopicSpec("test.cluster.features", TransactionEvent, key="user_id", partitions=3, retention_ms=DAY_MS)
FAILOVER = TopicSpec("test.cluster.failover", TransactionEvent, key="user_id", partitions=3, retention_ms=DAY_MS)
DEAD = TopicSpec("test.cluster.features.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)


@pytest.fixture(scope="module")
def cluster_settings(settings: Settings, stack) -> Iterator[Settings]:
    """The session's Kafka, with a Redis Cluster (3 masters, 3 replicas) of this module on free ports and a Feast
    registry of its own, the definitions applied."""
    home = settings.home / f"redis-cluster-{uuid.uuid4().hex[:6]}"
    redis_settings = RedisSettings(
        mode="cluster", port=free_port_block(6), cluster_bus_port=free_port_block(6), cluster_node_timeout_ms=NODE_TIMEOUT_MS
    )
    ours = settings.model_copy(
        update={
            "home": home,
            "redis": redis_settings,
            "feature_store": FeatureStoreSettings(feast_registry_path=home / "feast" / "registry.db"),
        }
    )
    cluster = build_stack(ours).redis
    assert isinstance(cluster, RedisCluster)
    try:
        cluster.start()
        apply_definitions(ours.feast_registry_path, ours.redis_connection, ours.repo_path, redis_cluster=True)
        yield ours
    finally:
        cluster.stop()
        cluster.wipe()


def _cluster(settings: Settings) -> RedisCluster:
    return build_stack(settings).redis


def _client(settings: Settings) -> redis.RedisCluster:
    return redis.RedisCluster(host=settings.redis.host, port=settings.redis.port)


def _user_row(user: str, version_us: int, count: int) -> FeatureRow:
    features = {
        "txn_count_5m": count,
        "txn_count_1h": count + 1,
        "txn_count_24h": count + 2,
        "amount_sum_1h": count * 1.25,
        "amount_sum_24h": count * 2.5,
        "amount_mean_1h": count / 3,
        "amount_mean_24h": count / 7,
        "amount_max_24h": float(count),
        "distinct_merchants_1h": count % 5,
        "distinct_countries_24h": count % 3,
        "secs_since_prev_txn": None if count % 4 == 0 else count * 0.5,
    }
    return FeatureRow(USER_VIEW, user, version_us, features)


def _masters_of(client: redis.RedisCluster, keys: list[bytes]) -> set[str]:
    return {client.get_node_from_key(key).name for key in keys}


def test_settings_name_every_node_and_the_stack_runs_three_masters_with_a_replica_each(cluster_settings: Settings) -> None:
    ports = cluster_settings.redis.node_ports
    assert len(ports) == 6 and cluster_settings.redis_connection == ",".join(f"127.0.0.1:{p}" for p in ports)
    config = feature_store(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    ).config
    assert config.online_store.redis_type == "redis_cluster"
    statuses = [s for s in build_stack(cluster_settings).status() if s.name.startswith("redis")]
    assert [(s.name, s.state) for s in statuses] == [(f"redis-{i}", "ready") for i in range(1, 7)], (
        "stack status covers every node"
    )
    nodes = _client(cluster_settings).cluster_nodes()
    masters = [n for n in nodes.values() if "master" in n["flags"]]
    assert len(masters) == 3 and sum("slave" in n["flags"] for n in nodes.values()) == 3
    assert {n["node_id"] for n in masters} == {n["master_id"] for n in nodes.values() if "slave" in n["flags"]}, (
        "one replica each"
    )


@pytest.fixture(scope="module")
def written(cluster_settings: Settings) -> list[str]:
    """64 users' rows (and a merchant's) written by Feast's store through its cluster client."""
    writer = OnlineWriter(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    now_us = int(time.time() * 1e6)
    users = [f"cluster-u{i}" for i in range(64)]
    rows = [_user_row(user, now_us - i, i) for i, user in enumerate(users)]
    rows.append(
        FeatureRow(
            MERCHANT_VIEW,
            "cluster-m1",
            now_us,
            {
                "merchant_txn_count_5m": 3,
                "merchant_txn_count_1h": 9,
                "merchant_amount_mean_1h": 12.5,
                "merchant_distinct_users_1h": 2,
            },
        )
    )
    assert writer.write(rows) == len(rows)
    return users


@pytest.mark.parametrize("count", [1, 64])
def test_fast_read_equals_feast_on_the_cluster(cluster_settings: Settings, written: list[str], count: int) -> None:
    store = feature_store(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    reader = OnlineReader(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    users = (written + ["cluster-missing"])[-count:]
    features = [f"{USER_VIEW}:{f.name}" for f in feature_fields(store.get_stream_feature_view(USER_VIEW))]
    rows = [{"user_id": u} for u in users]
    got = reader.get_online_features(features, rows)
    assert got == store.get_online_features(features, rows).to_dict()
    if count == 64:
        keys = [reader.layout.redis_key(("user_id",), (u,)) for u in users]
        assert len(_masters_of(_client(cluster_settings), keys)) == 3, "one read spans every master"
        assert got["txn_count_5m"][:-1] == list(range(1, 64)) and got["txn_count_5m"][-1] is None


def test_fast_read_across_views_equals_feast_on_the_cluster(cluster_settings: Settings, written: list[str]) -> None:
    store = feature_store(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    reader = OnlineReader(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    features = [f"{USER_VIEW}:txn_count_5m", f"{MERCHANT_VIEW}:merchant_amount_mean_1h"]
    rows = [{"user_id": written[3], "merchant_id": "cluster-m1"}, {"user_id": written[5], "merchant_id": "nope"}]
    got = reader.get_online_features(features, rows)
    assert got == store.get_online_features(features, rows).to_dict()
    assert got["txn_count_5m"] == [3, 5] and got["merchant_amount_mean_1h"] == [12.5, None]


def test_an_external_cluster_named_by_one_of_its_nodes_is_read_whole(cluster_settings: Settings, written: list[str]) -> None:
    """redis.nodes as a chart gives it (one address in front of the cluster; here a replica's): the clients learn every
    master from it, and the stack's host and port (a port nothing listens on) are not used."""
    external = cluster_settings.model_copy(
        update={
            "redis": cluster_settings.redis.model_copy(
                update={"nodes": [f"127.0.0.1:{cluster_settings.redis.node_ports[-1]}"], "port": 1}
            )
        }
    )
    assert external.redis_connection == f"127.0.0.1:{cluster_settings.redis.node_ports[-1]}"
    store = feature_store(external.feast_registry_path, external.redis_connection, external.repo_path, redis_cluster=True)
    reader = OnlineReader(external.feast_registry_path, external.redis_connection, external.repo_path, redis_cluster=True)
    features, rows = [f"{USER_VIEW}:txn_count_5m"], [{"user_id": user} for user in written]
    got = reader.get_online_features(features, rows)
    assert got == store.get_online_features(features, rows).to_dict() and got["txn_count_5m"] == list(range(64))
    assert len(_masters_of(_client(cluster_settings), [reader.layout.redis_key(("user_id",), (u,)) for u in written])) == 3


def test_the_result_cache_keeps_scores_on_every_master(cluster_settings: Settings) -> None:
    keys = [ResultCache.key("model", "1", [float(i)]) for i in range(30)]

    async def round_trip() -> list[float | None]:
        cache = ResultCache(cluster_settings.redis_connection, ttl_s=60, timeout_s=1.0, redis_cluster=True)
        try:
            for i, key in enumerate(keys):
                await cache.put(key, i / 10)
            return [await cache.get(key) for key in keys]
        finally:
            await cache.close()

    assert asyncio.run(round_trip()) == [i / 10 for i in range(30)]
    assert len(_masters_of(_client(cluster_settings), [k.encode() for k in keys])) == 3


def test_the_feature_job_writes_into_the_cluster_what_feast_and_the_scorer_read(cluster_settings: Settings) -> None:
    """The real streaming job (PyFlink's mini-cluster, in a `loopline stream submit` child with these settings)."""
    bootstrap = cluster_settings.kafka.bootstrap
    apply_topics(bootstrap, [SOURCE, DEAD])
    start_ms = int(time.time() * 1000) - 300_000
    config = {"users": 150, "merchants": 20, "rate_per_s": 200, "out_of_order_rate": 0.1, "late_rate": 0.0, "malformed_rate": 0.0}
    events = [
        replace(e, topic=SOURCE.name)
        for e in itertools.islice(fraud_world(16, start_ms, **config), 1_200)
        if e.topic == "events.transactions"
    ]
    EventProducer(bootstrap).publish(events)
    store = feature_store(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )
    plan = compile_plan(store.list_stream_feature_views(), FRAUD).reading({TRANSACTIONS.name: SOURCE.name})
    accepted, _ = accepted_events(plan, SOURCE.name, read_topic(bootstrap, SOURCE.name))
    expected = {view.name: recompute(view, accepted) for view in plan.views}
    reader = OnlineReader(
        cluster_settings.feast_registry_path, cluster_settings.redis_connection, cluster_settings.repo_path, redis_cluster=True
    )

    def read(view, offline: pd.DataFrame) -> pd.DataFrame:
        rows = [{view.entity_key: key} for key in offline[view.entity_key]]
        return pd.DataFrame(reader.get_online_features([f"{view.name}:{f}" for f in view.feature_names], rows))

    home = cluster_settings.home
    job = start_feature_job(
        cluster_settings,
        home / "job.log",
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: SOURCE.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=DEAD.name,
        LOOPLINE_STREAM__GROUP_ID=f"cluster-{uuid.uuid4()}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(home / "offline"),
        LOOPLINE_STREAM__METRICS_PORT="0",
    )
    problems: list[str] = []

    def agrees_or_job_gone() -> bool:
        problems[:] = feature_differences(plan, expected, read)
        return job.poll() is not None or not problems

    try:
        assert wait_until(agrees_or_job_gone, 180, 1.0) and job.poll() is None, (
            f"{len(problems)} online values differ from the recompute, e.g. {problems[:5]}; see {home / 'job.log'}"
        )
    finally:
        stop_process_group(job, signal.SIGKILL)
    for view in plan.views:
        keys = list(expected[view.name][view.entity_key])
        features, rows = [f"{view.name}:{f}" for f in view.feature_names], [{view.entity_key: k} for k in keys]
        assert reader.get_online_features(features, rows) == store.get_online_features(features, rows).to_dict()
        assert len(_masters_of(_client(cluster_settings), [reader.layout.redis_key(view.entity_keys, (k,)) for k in keys])) == 3


def test_a_write_counts_only_once_a_replica_has_it(cluster_settings: Settings) -> None:
    """``replica_acks``: a master whose replica is frozen (SIGSTOP) takes the rows, but the write is refused, naming
    the node; thawed, the same write goes through."""
    cluster, client = _cluster(cluster_settings), _client(cluster_settings)
    writer = OnlineWriter(
        cluster_settings.feast_registry_path,
        cluster_settings.redis_connection,
        cluster_settings.repo_path,
        redis_cluster=True,
        replica_acks=1,
        replica_ack_timeout_ms=300,
    )
    users = [f"acks-u{i}" for i in range(30)]
    master = client.get_node_from_key(writer.layout.redis_key(("user_id",), (users[0],)))
    replica = next(
        node for node in cluster.nodes if node.query("ROLE")[0] == b"slave" and int(node.query("ROLE")[2]) == master.port
    )
    now_us = int(time.time() * 1e6)
    os.kill(replica.pid(), signal.SIGSTOP)
    try:
        with pytest.raises(ReplicaAckError, match=rf"on {master.name} reached 0 of 1 replica\(s\) within 300 ms"):
            writer.write([_user_row(user, now_us, 1) for user in users])
    finally:
        os.kill(replica.pid(), signal.SIGCONT)
    assert wait_until(lambda: cluster.healthy(), 30, 0.2)
    assert writer.write([_user_row(user, now_us + 1, 2) for user in users]) == len(users)


@dataclass(frozen=True)
class _Answer:
    sent_s: float
    latency_s: float
    #: Why the read fell back to the defaults ("unavailable", "over_budget"), None if it did not.
    fallback: str | None
    count: int | None


def _read_load(fetcher: FeatureFetcher, users: list[str], stop: threading.Event, answers: list[_Answer]) -> None:
    """The scorer's feature fetch, 200 requests a second (each sent on time, whatever the earlier ones take)."""

    async def one(user: str) -> None:
        sent = time.monotonic()
        fetched = await fetcher.fetch({"user_id": user}, int(time.time() * 1000))
        count = fetched.values[f"{USER_VIEW}:txn_count_5m"]
        answers.append(_Answer(sent, time.monotonic() - sent, fetched.fallback, count))

    async def load() -> None:
        rng, tasks = random.Random(7), set()
        while not stop.is_set():
            task = asyncio.create_task(one(rng.choice(users)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        await fetcher.close()

    asyncio.run(load())


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def _events(users: list[str], at_ms: int, batch: str) -> list[Emitted]:
    """One transaction per user at ``at_ms``, on the failover drill's topic."""
    events = []
    for user in users:
        event = TransactionEvent(
            schema_version=1,
            event_id=f"{user}-{batch}",
            event_time_ms=at_ms,
            user_id=user,
            merchant_id="m1",
            amount=10.0,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        events.append(Emitted(FAILOVER.name, user, FRAUD.encode(TRANSACTIONS.name, event), at_ms, event))
    return events


def test_a_master_killed_under_load_fails_over_and_no_row_is_lost(cluster_settings: Settings) -> None:
    """The feature job writes the rows (acknowledged by a replica each, ``redis.write_acks`` 1 by the shape); nobody
    writes them again by hand. With the victim master's replica frozen (SIGSTOP), a second event per user reaches the
    master, which acknowledges its rows; the replica does not, so the job's batch fails and no checkpoint covers
    those events. Then the master is killed and the replica thawed: it takes over without the rows only the master
    held, and the job, restarted from its last checkpoint, writes them again. Meanwhile reads are answered on defaults
    within the budget, and at the end every user reads both events. With ``write_acks`` 0 the master's
    acknowledgement would have let a checkpoint complete over rows the failover lost, never written again.

    Runs last here: it kills a master, then restarts it (it rejoins as a replica of the promoted one)."""
    cluster, client = _cluster(cluster_settings), _client(cluster_settings)
    assert cluster_settings.redis.replica_acks == 1
    connection, home = cluster_settings.redis_connection, cluster_settings.home
    bootstrap = cluster_settings.kafka.bootstrap
    apply_topics(bootstrap, [FAILOVER, DEAD])
    reader = OnlineReader(
        cluster_settings.feast_registry_path, connection, cluster_settings.repo_path, timeout_s=BUDGET_S, redis_cluster=True
    )
    users = [f"failover-u{i}" for i in range(300)]
    victim_key = reader.layout.redis_key(("user_id",), (users[0],))
    victim = next(node for node in cluster.nodes if node.port == client.get_node_from_key(victim_key).port)
    replica = next(
        node for node in cluster.nodes if node.query("ROLE")[0] == b"slave" and int(node.query("ROLE")[2]) == victim.port
    )
    on_victim = [u for u in users if client.get_node_from_key(reader.layout.redis_key(("user_id",), (u,))).port == victim.port]
    checkpoints, log = home / "failover-checkpoints", home / "failover-job.log"
    job = start_feature_job(
        cluster_settings,
        log,
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: FAILOVER.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=DEAD.name,
        LOOPLINE_STREAM__GROUP_ID=f"failover-{uuid.uuid4()}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(home / "failover-offline"),
        LOOPLINE_STREAM__METRICS_PORT="0",
        LOOPLINE_STREAM__CHECKPOINT_DIR=str(checkpoints),
        LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS="1000",
    )
    counts = lambda: reader.get_online_features([f"{USER_VIEW}:txn_count_5m"], [{"user_id": u} for u in users])["txn_count_5m"]  # noqa: E731

    def every_user_reads(count: int) -> bool:
        assert job.poll() is None, f"the job ended; see {log}"
        try:
            return all(c == count for c in counts())
        except (redis.RedisError, OSError):
            return False

    fetcher = FeatureFetcher(reader, [f"{USER_VIEW}:txn_count_5m"], budget_s=BUDGET_S)
    stop, answers = threading.Event(), []
    load = threading.Thread(target=_read_load, args=(fetcher, users, stop, answers), daemon=True)
    frozen = job_frozen = False
    try:
        first_ms = int(time.time() * 1000)
        EventProducer(bootstrap).publish(_events(users, first_ms, "a"))
        assert wait_until(lambda: every_user_reads(1), 180, 0.5), f"the job wrote every user's first row; see {log}"
        covered = latest_checkpoint(checkpoints)
        assert wait_until(lambda: latest_checkpoint(checkpoints) != covered, 30, 0.2), "a checkpoint completes over them"

        # As `loopline serve` does before serving: a full collection walking the millions of objects this process holds
        # (Feast, PyFlink's recompute, the earlier tests') stalls every thread for a few hundred ms.
        gc.collect()
        gc.freeze()
        load.start()
        assert wait_until(lambda: len(answers) > 200, 10), "the read load runs"
        os.kill(replica.pid(), signal.SIGSTOP)
        frozen = True
        # Cut the replication link too: what the master sends the frozen replica would wait in its socket, read on waking.
        victim.query("CLIENT", "KILL", "TYPE", "replica")
        EventProducer(bootstrap).publish(_events(users, first_ms + 1_000, "b"))
        refused = f"reached 0 of 1 replica(s) within {cluster_settings.redis.write_ack_timeout_ms} ms"
        flink_logs = log.with_name(f"{log.stem}-flink")  # where the job's JVM logs (loopline.job_processes)

        def batch_refused() -> bool:
            return any(refused in f.read_text(errors="replace") for f in flink_logs.glob("*.log"))

        assert wait_until(batch_refused, 60, 0.2), f"the unacknowledged batch failed; see {flink_logs}"
        victim_counts: list[int] = []

        def victim_users_read() -> bool:
            try:
                read = counts()
            except (redis.RedisError, OSError):  # a moved slot, until the reader's cluster client learns the new master
                return False
            victim_counts[:] = [read[users.index(u)] for u in on_victim]
            return True

        # The master holds (and acknowledged) second rows, those of the batches written before the first refusal failed
        # the job's attempt; its frozen replica holds none.
        assert wait_until(lambda: victim_users_read() and 2 in victim_counts, 60, 0.2), "the master has second rows"
        # The job frozen too, so that nothing writes between the promotion and the look at what the promoted node holds.
        os.killpg(job.pid, signal.SIGSTOP)
        job_frozen = True
        killed = time.monotonic()
        os.kill(victim.pid(), signal.SIGKILL)
        os.kill(replica.pid(), signal.SIGCONT)
        frozen = False
        assert wait_until(lambda: replica.query("ROLE")[0] == b"master", 30, 0.02), "the replica takes over"
        promoted = time.monotonic()
        assert wait_until(victim_users_read, 30, 0.2), "the promoted master answers"
        assert set(victim_counts) == {1}, "the failover lost the second rows, acknowledged by the killed master alone"
        os.killpg(job.pid, signal.SIGCONT)
        job_frozen = False
        cluster.start()  # the killed node back: it rejoins as the promoted one's replica, which acknowledges writes again
        assert victim.query("ROLE")[0] == b"slave" and cluster.healthy()
        assert wait_until(lambda: every_user_reads(2), 120, 0.5), f"the job wrote every user's second row; see {log}"
        recovered = time.monotonic()
        assert wait_until(lambda: any(a.sent_s > recovered + 1.0 for a in answers), 10), "the load goes on after the recovery"
    finally:
        if frozen:
            os.kill(replica.pid(), signal.SIGCONT)
        if job_frozen:
            os.killpg(job.pid, signal.SIGCONT)
        stop.set()
        if load.is_alive():
            load.join(30)
        gc.unfreeze()
        stop_process_group(job, signal.SIGKILL)

    # Two shared cores can make any read late (over budget, on defaults); only the outage makes Redis unavailable.
    before, after = [a for a in answers if a.sent_s < killed], [a for a in answers if a.sent_s > recovered]
    assert all(a.fallback != "unavailable" for a in before + after), "Redis unavailable only after the kill, until the recovery"
    assert all(a.count == 2 for a in after if a.fallback is None), "fresh again: every read after the recovery has the new row"
    # Over budget is the cores' doing (5.5 % of these reads at load average 14 on 2 cores), not Redis's: only most must
    # be in time.
    assert sum(a.fallback is None for a in after) >= 0.5 * len(after), "... and most come from Redis, in time"
    defaulted = [a for a in answers if a.fallback == "unavailable" and killed <= a.sent_s <= recovered]
    assert defaulted, "reads to the killed master fall back to the defaults"
    last_default = max(a.sent_s for a in defaulted)
    during = [a for a in answers if killed <= a.sent_s <= last_default]
    latencies = [a.latency_s for a in during]
    hung = [(round(a.sent_s - killed, 3), round(a.latency_s, 3), a.fallback) for a in during if a.latency_s > HANG_S]
    assert _p99(latencies) <= BUDGET_S + SLACK_S and not hung, (
        f"reads meanwhile answered within the budget (p99 {_p99(latencies) * 1000:.1f} ms), none hung; "
        f"(sent after the kill, took, fallback): {hung[:10]}"
    )
    assert last_default < promoted + 5.0, "Redis available again soon after the promotion"
    store = feature_store(cluster_settings.feast_registry_path, connection, cluster_settings.repo_path, redis_cluster=True)
    rows = [{"user_id": u} for u in users]
    got = reader.get_online_features([f"{USER_VIEW}:txn_count_5m"], rows)
    assert got == store.get_online_features([f"{USER_VIEW}:txn_count_5m"], rows).to_dict()
    print(
        f"\nfailover {promoted - killed:.2f} s (node timeout {NODE_TIMEOUT_MS} ms); Redis unavailable for "
        f"{last_default - killed:.2f} s: {sum(a.fallback is not None for a in during)}/{len(during)} reads meanwhile, p99 "
        f"{_p99([a.latency_s for a in during]) * 1000:.1f} ms, max {max(a.latency_s for a in during) * 1000:.1f} ms; "
        f"{len(on_victim)}/{len(users)} users on the killed master; every row back {recovered - killed:.1f} s after the kill"
    )
