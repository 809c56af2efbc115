"""Both Flink jobs on a standalone session cluster (`loopline flink up`): two TaskManagers started with a bare
environment (PATH /usr/local/bin:/usr/bin:/bin, no PYTHONPATH or VIRTUAL_ENV: Debian's Python 3.11 and Java, no
Loopline, Feast or PyFlink), the jobs shipped by `stream submit` / `feedback join --jobmanager` (code, Python
environment archive, jars, settings) at parallelism 2.

The feature job's online features equal the offline recompute through a kill -9 of a TaskManager (every view, the
merchant view too, whose entities several partitions feed and a replay interleaves anew), through a stop with a
savepoint resumed at parallelism 1, and rebuilt by `--no-restore` from the retained events; its dead letters are
committed exactly once per run. Real Kafka, Redis, Flink, Feast.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from feature_store.config import apply_definitions, feature_store
from infra.flink_cluster import cancel_job, list_jobs, rest_get
from infra.service import free_ports, wait_until
from infra.settings import FlinkSettings
from loopline.settings import Settings, settings_environment
from schemas import DeadLetterRecord, PredictionRecord, TrainingExample, decode, encode
from schemas.topics import DAY_MS, TopicSpec
from streams.checkpoint_origin import kafka_cluster_id, recorded_origin, recorded_plan
from streams.feature_plan import FeaturePlan, compile_plan
from streams.flink_submit import ENVIRONMENT_DIR
from streams.producer import EventProducer
from streams.recompute import accepted_events, feature_differences, recompute
from streams.topics import apply_topics, read_topic
from streams.world import Emitted
from tests.support.paths import REPO
from tests.support.templates import FRAUD, TRANSACTIONS, LabelEvent, TransactionEvent, fraud_world

#: The integration tier: a Flink session cluster of its own.
pytestmark = pytest.mark.stack

RUN = uuid.uuid4().hex[:6]
SOURCE = TopicSpec(f"test.cluster.events.{RUN}", TransactionEvent, key="user_id", partitions=4, retention_ms=DAY_MS)
DEAD = TopicSpec(f"test.cluster.dlq.{RUN}", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
PREDICTIONS = TopicSpec(f"test.cluster.predictions.{RUN}", PredictionRecord, key="request_id", partitions=2, retention_ms=DAY_MS)
LABELS = TopicSpec(f"test.cluster.labels.{RUN}", LabelEvent, key="event_id", partitions=2, retention_ms=DAY_MS)
EXAMPLES = TopicSpec(f"test.cluster.examples.{RUN}", TrainingExample, key="event_id", partitions=2, retention_ms=DAY_MS)
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
START_MS = int(time.time() * 1000) - 600_000
STREAM = {"users": 150, "merchants": 30, "rate_per_s": 200, "out_of_order_rate": 0.1, "late_rate": 0.02, "malformed_rate": 0.01}
BATCH = 600


def _loopline(settings: Settings, *args: str, bare: bool = False, **extra: str) -> subprocess.CompletedProcess:
    """`loopline <args>` with ``settings``; with ``bare`` in an environment of nothing but PATH, HOME and the settings."""
    env = settings_environment(settings, **extra)
    if bare:
        env = {k: v for k, v in env.items() if k.startswith("LOOPLINE_")} | {"PATH": BARE_PATH, "HOME": os.environ["HOME"]}
    result = subprocess.run(
        [sys.executable, "-c", "from loopline.cli import main; main()", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, f"loopline {' '.join(args)}: {result.stdout[-1500:]} {result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def cluster(settings: Settings, stack) -> Iterator[Settings]:
    """`loopline flink up --taskmanagers 2` with a bare environment; the settings that reach it. `flink down` after."""
    rest, rpc = free_ports(2)
    on_cluster = settings.model_copy(update={"flink": FlinkSettings(rest_port=rest, rpc_port=rpc)})
    _loopline(on_cluster, "flink", "up", "--taskmanagers", "2", "--slots", "2", bare=True)
    yield on_cluster
    _loopline(on_cluster, "flink", "down")
    assert not _taskmanager_pids(on_cluster), "flink down left TaskManagers running"


def _address(settings: Settings) -> str:
    return f"{settings.flink.host}:{settings.flink.rest_port}"


def _taskmanager_pids(settings: Settings) -> dict[int, int]:
    """Running TaskManagers by index (their pid files under <home>/flink/run)."""
    pids = {}
    for pid_file in (settings.home.absolute() / "flink" / "run").glob("flink-taskmanager-*.pid"):
        pid = int(pid_file.read_text())
        if Path(f"/proc/{pid}").exists():
            pids[int(pid_file.stem.rsplit("-", 1)[1])] = pid
    return pids


def _descendants(pid: int) -> list[int]:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _python_workers(settings: Settings) -> dict[int, list[str]]:
    """The executables of each TaskManager's Python processes (its job's Python workers), by TaskManager index."""
    workers = {}
    for index, pid in _taskmanager_pids(settings).items():
        exes = []
        for child in _descendants(pid):
            try:
                exe = os.readlink(f"/proc/{child}/exe")
            except OSError:
                continue
            if "python" in Path(exe).name:
                exes.append(exe)
        workers[index] = exes
    return workers


def _assert_workers_run_from_the_archive(settings: Settings) -> None:
    """Every TaskManager runs Python workers, each the interpreter unpacked from the job environment archive."""
    workers: dict[int, list[str]] = {}

    def every_taskmanager_has_workers() -> bool:
        workers.update(_python_workers(settings))
        return len(workers) == 2 and all(workers.values())

    assert wait_until(every_taskmanager_has_workers, 120, 1), f"Python workers per TaskManager: {workers}"
    exes = [exe for found in workers.values() for exe in found]
    assert all(f"/{ENVIRONMENT_DIR}/bin/python" in exe for exe in exes), exes
    assert not any(exe.startswith((str(REPO), sys.prefix, sys.base_prefix)) for exe in exes), exes


def test_taskmanagers_have_a_bare_environment(cluster: Settings) -> None:
    pids = _taskmanager_pids(cluster)
    assert sorted(pids) == [0, 1] and rest_get(_address(cluster), "/overview")["taskmanagers"] == 2
    for pid in pids.values():
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        assert environ["PATH"] == BARE_PATH and "PYTHONPATH" not in environ and "VIRTUAL_ENV" not in environ
    status = _loopline(cluster, "flink", "status")
    assert status.stdout.count("ready") == 3, status.stdout


def _bad_records() -> list[Emitted]:
    good = json.loads(next(e for e in fraud_world(99, START_MS, **STREAM) if e.record).value)
    cases = {"not json": b"{this is not json", "wrong type": json.dumps({**good, "amount": "twelve"}).encode()}
    return [Emitted(SOURCE.name, f"bad-{name}", value, START_MS, None) for name, value in cases.items()]


def _committed(bootstrap: str, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = consumer.committed([TopicPartition(SOURCE.name, p) for p in range(SOURCE.partitions)], timeout=10)
    consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def _job(settings: Settings, job_id: str) -> dict:
    return rest_get(_address(settings), f"/jobs/{job_id}", timeout_s=10)


def _running(settings: Settings, job_id: str, parallelism: int) -> bool:
    job = _job(settings, job_id)
    vertices = job["vertices"]
    return (
        job["state"] == "RUNNING"
        and max(v["parallelism"] for v in vertices) == parallelism
        and all(v["status"] == "RUNNING" for v in vertices)
    )


def _last_checkpoint_ms(settings: Settings, job_id: str) -> int:
    completed = rest_get(_address(settings), f"/jobs/{job_id}/checkpoints", timeout_s=10)["latest"]["completed"]
    return completed["latest_ack_timestamp"] if completed else 0


def _submitted_id(output: str) -> str:
    return output.split("job ")[-1].strip()


@pytest.fixture(scope="module")
def topics(bootstrap: str) -> None:
    apply_topics(bootstrap, [SOURCE, DEAD, PREDICTIONS, LABELS, EXAMPLES])


@pytest.fixture(scope="module")
def plan(settings: Settings, topics: None) -> FeaturePlan:
    apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    # This module compares the whole online store with its own recompute: it starts from an empty one.
    redis.Redis(port=settings.redis.port).flushdb()
    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
    return compile_plan(store.list_stream_feature_views(), FRAUD).reading({TRANSACTIONS.name: SOURCE.name})


# Its waits sum to 1500 s, a bound only a failing run nears (each ends as its condition holds); one run of 4 passed
# pytest's 300 s default at load average ~12, resubmitting from the savepoint.
@pytest.mark.timeout(900)
def test_feature_job_through_a_taskmanager_kill_and_a_savepoint(cluster: Settings, bootstrap: str, plan: FeaturePlan) -> None:
    group, shared = f"test-cluster-{RUN}", cluster.home.absolute() / f"shared-{RUN}"
    env = {
        "LOOPLINE_STREAM__SOURCE_TOPICS": json.dumps({TRANSACTIONS.name: SOURCE.name}),
        "LOOPLINE_STREAM__DEAD_LETTER_TOPIC": DEAD.name,
        "LOOPLINE_STREAM__GROUP_ID": group,
        "LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS": "1000",
        "LOOPLINE_STREAM__OFFLINE_DIR": str(cluster.home / f"offline-{RUN}"),
        # Checkpoints and savepoints on the cluster's shared volume, named as a Flink filesystem URI.
        "LOOPLINE_STREAM__CHECKPOINT_DIR": (shared / "checkpoints").as_uri(),
    }
    address = _address(cluster)
    stream = iter(fraud_world(11, START_MS, **STREAM))
    producer = EventProducer(bootstrap)

    def publish() -> None:
        producer.publish(
            [
                dataclasses.replace(e, topic=SOURCE.name)
                for e in itertools.islice(stream, BATCH)
                if e.topic == "events.transactions"
            ]
        )

    store = feature_store(cluster.feast_registry_path, cluster.redis_connection, cluster.repo_path)

    def agrees_with_the_recompute(timeout_s: float, letters_from: int = 0) -> list[str]:
        """Wait until online features equal the recompute of everything the topic holds; check the dead letters."""
        messages = read_topic(bootstrap, SOURCE.name)
        accepted, late = accepted_events(plan, SOURCE.name, messages)
        expected = {view.name: recompute(view, accepted) for view in plan.views}
        problems: list[str] = []

        def agrees() -> bool:
            problems[:] = feature_differences(plan, expected, _online(store))
            return not problems

        assert wait_until(agrees, timeout_s, 1), f"{len(problems)} online values differ from the recompute: {problems[:5]}"
        letters = [
            d
            for m in read_topic(bootstrap, DEAD.name)
            if m.offset() >= letters_from and (d := decode(DeadLetterRecord, m.value())).source_topic == SOURCE.name
        ]
        positions = Counter((d.source_partition, d.source_offset) for d in letters)
        assert max(positions.values()) == 1, "each dead letter committed once"
        late_positions = {(d.source_partition, d.source_offset) for d in letters if d.reason == "late"}
        assert late_positions == set(zip(late["partition"], late["offset"], strict=True)), "exactly the late events"
        refused = [d.key for d in letters if d.reason in ("invalid", "out_of_range")]
        assert len(refused) == len(messages) - len(accepted) - len(late) and {"bad-not json", "bad-wrong type"} <= set(refused)
        return problems

    try:
        producer.publish(_bad_records())
        publish()
        # The printed command is exact: running it is the submission.
        printed = _loopline(cluster, "stream", "submit", "--jobmanager", address, "--parallelism", "2", "--print-command", **env)
        command = shlex.split(printed.stdout.strip().splitlines()[-1])
        assert "--pyArchives" in command and command[command.index("--pyExecutable") + 1] == f"{ENVIRONMENT_DIR}/bin/python"
        submitted = subprocess.run(command, capture_output=True, text=True, timeout=300, env=settings_environment(cluster, **env))
        assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
        job_id = submitted.stdout.split("JobID ")[1].split()[0]
        assert wait_until(lambda: _running(cluster, job_id, 2), 180, 1), _job(cluster, job_id)
        _assert_workers_run_from_the_archive(cluster)
        assert wait_until(lambda: _committed(bootstrap, group) >= BATCH // 4, 240, 1), "no checkpoint covered the first batch"

        # Mid-stream: a second batch on its way, one TaskManager killed without warning.
        publish()
        killed_at = time.time()
        # The TaskManager's machine dies: its JVM and the Python workers it started.
        doomed = _taskmanager_pids(cluster)[1]
        for pid in [doomed, *_descendants(doomed)]:
            os.kill(pid, signal.SIGKILL)
        assert wait_until(
            lambda: _running(cluster, job_id, 2) and _last_checkpoint_ms(cluster, job_id) > killed_at * 1000, 180, 0.5
        )
        recovered_s = time.time() - killed_at
        print(f"\nkill -9 of a TaskManager: the job ran again, checkpointing, after {recovered_s:.1f} s")
        # Every view is exact with no event after the kill's: the merchant view's replay interleaves the partitions
        # that feed a merchant anew, and its rows still order above those written before the kill.
        agrees_with_the_recompute(240)

        stopped = _loopline(cluster, "stream", "stop", "--jobmanager", address, **env)
        savepoint = stopped.stdout.split("with savepoint ")[1].split()[0]
        assert Path(urllib.parse.urlparse(savepoint).path).parent == shared / "checkpoints" / "savepoints", savepoint
        # A restore from it is checked against the Kafka cluster it describes, as one from a checkpoint is.
        assert recorded_origin(savepoint) == kafka_cluster_id(bootstrap, {})
        assert wait_until(lambda: _job(cluster, job_id)["state"] == "FINISHED", 60, 0.5)

        publish()
        resumed = _loopline(
            cluster, "stream", "submit", "--jobmanager", address, "--parallelism", "1", "--from-savepoint", savepoint, **env
        )
        resumed_id = _submitted_id(resumed.stdout)
        # A job `stream submit` started records the plan its windows are built under (a printed command's does not).
        assert recorded_plan(str(shared / "checkpoints" / resumed_id)) == plan.identities()
        assert wait_until(lambda: _running(cluster, resumed_id, 1), 180, 1), _job(cluster, resumed_id)
        agrees_with_the_recompute(240)
        _loopline(cluster, "stream", "cancel", "--jobmanager", address, **env)
        assert wait_until(lambda: _job(cluster, resumed_id)["state"] == "CANCELED", 60, 0.5)

        # --no-restore rebuilds every view from the retained events: with the online store emptied and the group's
        # offsets at the log's end, only a rebuild brings every row back, exact. Its dead letters are its own run's.
        # (The group has committed offsets: a start from them reads nothing old, where the broker's reset would.)
        assert _committed(bootstrap, group) > 0
        redis.Redis(port=cluster.redis.port).flushdb()
        letters_from = max((m.offset() for m in read_topic(bootstrap, DEAD.name)), default=-1) + 1
        rebuilt = _loopline(cluster, "stream", "submit", "--jobmanager", address, "--parallelism", "2", "--no-restore", **env)
        rebuilt_id = _submitted_id(rebuilt.stdout)
        assert wait_until(lambda: _running(cluster, rebuilt_id, 2), 180, 1), _job(cluster, rebuilt_id)
        agrees_with_the_recompute(240, letters_from)
        _loopline(cluster, "stream", "cancel", "--jobmanager", address, **env)
        assert wait_until(lambda: _job(cluster, rebuilt_id)["state"] == "CANCELED", 60, 0.5)
        # The killed TaskManager comes back (as a supervisor would restart it): `flink up` starts only what is missing.
        up = _loopline(cluster, "flink", "up", "--taskmanagers", "2", bare=True)
        assert "started: flink-taskmanager-1" in up.stdout, up.stdout
    finally:  # the next test gets both TaskManagers and free slots, whatever happened here
        for job in list_jobs(address):
            if job["state"] == "RUNNING":
                cancel_job(address, job["id"])
        _loopline(cluster, "flink", "up", "--taskmanagers", "2", bare=True)


def _online(store):
    def read(view, offline: pd.DataFrame) -> pd.DataFrame:
        rows = [{view.entity_key: k} for k in offline[view.entity_key]]
        return store.get_online_features(features=[f"{view.name}:{f}" for f in view.feature_names], entity_rows=rows).to_df()

    return read


@pytest.mark.timeout(600)  # its waits sum to 540 s, and the submission runs `flink run` first
def test_joiner_at_parallelism_2(cluster: Settings, bootstrap: str, topics: None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    t0, events = int(time.time() * 1000) - 300_000, 200
    expected: dict[str, bool | None] = {}
    for n in range(events):
        event, at = f"ev-{n}", t0 + n * 50
        prediction = PredictionRecord(
            schema_version=1,
            request_id=f"req-{n}",
            entity_keys={"user_id": f"u-{n}"},
            features={"f:x": 1.5},
            model_name="fraud",
            model_version="1",
            score=0.25,
            requested_at_ms=at - 5,
            scored_at_ms=at,
            event_id=event,
        )
        producer.produce(PREDICTIONS.name, encode(prediction), f"req-{n}", timestamp=at)
        if n % 2 == 0:  # labeled within the horizon; the odd ones never are
            label = LabelEvent(
                schema_version=1,
                event_id=event,
                user_id=f"u-{n}",
                is_fraud=n % 4 == 0,
                label_time_ms=at + 3_000,
                source="chargeback",
            )
            producer.produce(LABELS.name, encode(label), event, timestamp=at + 3_000)
        expected[event] = n % 4 == 0 if n % 2 == 0 else None
    producer.produce(PREDICTIONS.name, b"{not json", "bad", timestamp=t0)
    # A record on every partition far past the horizon: the watermark passes every event's horizon.
    tail = t0 + events * 50 + 60_000
    for topic in (PREDICTIONS, LABELS):
        for partition in range(topic.partitions):
            producer.produce(topic.name, b"{tail", "tail", timestamp=tail, partition=partition)
    assert producer.flush(30) == 0

    env = {
        "LOOPLINE_FEEDBACK__PREDICTIONS_TOPIC": PREDICTIONS.name,
        "LOOPLINE_FEEDBACK__LABELS_TOPIC": LABELS.name,
        "LOOPLINE_FEEDBACK__EXAMPLES_TOPIC": EXAMPLES.name,
        "LOOPLINE_FEEDBACK__DEAD_LETTER_TOPIC": DEAD.name,
        "LOOPLINE_FEEDBACK__GROUP_ID": f"fb-cluster-{RUN}",
        "LOOPLINE_FEEDBACK__HORIZON_S": "20",
        "LOOPLINE_FEEDBACK__CHECKPOINT_INTERVAL_MS": "1000",
    }
    submitted = _loopline(cluster, "feedback", "join", "--jobmanager", _address(cluster), "--parallelism", "2", **env)
    job_id = _submitted_id(submitted.stdout)
    try:
        assert wait_until(lambda: _running(cluster, job_id, 2), 180, 1), _job(cluster, job_id)
        _assert_workers_run_from_the_archive(cluster)

        def examples() -> list[TrainingExample]:
            return [decode(TrainingExample, m.value()) for m in read_topic(bootstrap, EXAMPLES.name)]

        assert wait_until(lambda: len(examples()) >= events, 240, 1), f"{len(examples())} of {events} examples"
        logged = examples()
    finally:
        cancel_job(_address(cluster), job_id)
    counts = Counter(e.event_id for e in logged)
    assert set(counts) == set(expected) and max(counts.values()) == 1, "one example per scored event, none doubled"
    assert {e.event_id: e.label for e in logged} == expected
    letters = [decode(DeadLetterRecord, m.value()) for m in read_topic(bootstrap, DEAD.name)]
    assert Counter(d.key for d in letters if d.source_topic == PREDICTIONS.name)["bad"] == 1
