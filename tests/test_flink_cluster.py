"""The remote path: `loopline stream submit --jobmanager` on a standalone Flink cluster from the PyFlink distribution."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from conftest import REPO
from feature_store.config import apply_definitions
from feature_store.online_read import OnlineReader
from infra.flink_cluster import FlinkJobManager, FlinkTaskManager, list_jobs
from infra.service import free_port, wait_until
from loopline.settings import Settings, settings_environment
from schemas import TransactionEvent
from schemas.topics import DAY_MS, TopicSpec
from streams.producer import EventProducer
from streams.synthetic import SyntheticConfig, SyntheticStream
from streams.topics import apply_topics

SOURCE = TopicSpec("test.remote", TransactionEvent, key="user_id", partitions=2, retention_ms=DAY_MS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("flink-cluster")
    rest_port = free_port()
    jobmanager = FlinkJobManager(home / "conf", "127.0.0.1", rest_port, free_port(), home / "run", home / "logs")
    taskmanager = FlinkTaskManager(home / "conf", "127.0.0.1", rest_port, home / "run", home / "logs")
    jobmanager.start()
    taskmanager.start()
    yield jobmanager.address
    taskmanager.stop()
    jobmanager.stop()


def loopline(settings: Settings, group: str, *args: str) -> subprocess.CompletedProcess:
    env = settings_environment(
        settings,
        LOOPLINE_STREAM__SOURCE_TOPIC=SOURCE.name,
        LOOPLINE_STREAM__GROUP_ID=group,
        LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / "offline"),
    )
    return subprocess.run(
        [sys.executable, "-c", "from loopline.cli import main; main()", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_submit_status_cancel_on_a_standalone_cluster(settings: Settings, bootstrap: str, cluster: str) -> None:
    apply_definitions(settings.feast_registry_path, settings.redis_connection)
    apply_topics(bootstrap, [SOURCE])
    group = f"test-remote-{uuid.uuid4()}"
    submitted = loopline(settings, group, "stream", "submit", "--jobmanager", cluster)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert "submitted to" in submitted.stdout
    assert [job["state"] for job in list_jobs(cluster)] == ["RUNNING"]

    stream = SyntheticStream(SyntheticConfig(users=20, late_rate=0.0), seed=8, start_ms=int(time.time() * 1000))
    events = [dataclasses.replace(e, topic=SOURCE.name) for e in itertools.islice(stream, 300) if e.record and e.topic == "events.transactions"]
    EventProducer(bootstrap).publish(events)
    last = {e.key: e.record.event_time_ms for e in events}
    reader = OnlineReader(settings.feast_registry_path, settings.redis_connection)

    def newest_rows_written() -> bool:
        stamps = reader.row_timestamps_us("user_transaction_features", list(last))
        return all(s is not None and s >= last[u] * 1000 for u, s in zip(last, stamps, strict=True))

    assert wait_until(newest_rows_written, 180, interval_s=1), "the cluster's job did not write every user's newest row"

    status = loopline(settings, group, "stream", "status", "--jobmanager", cluster)
    assert "loopline-features" in status.stdout and "RUNNING" in status.stdout
    cancelled = loopline(settings, group, "stream", "cancel", "--jobmanager", cluster)
    assert cancelled.returncode == 0 and "cancelling" in cancelled.stdout

    def cancelled() -> bool:
        return [job["state"] for job in list_jobs(cluster)] == ["CANCELED"]

    assert wait_until(cancelled, 60, interval_s=0.5), f"job not cancelled: {list_jobs(cluster)}"
