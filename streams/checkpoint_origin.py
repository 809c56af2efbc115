"""Which Kafka cluster a job's checkpoints describe: recorded beside them when the job starts, checked before one is
restored.

A checkpoint holds the sources' offsets and the exactly-once sinks' open transactions of one Kafka cluster. Restored
against another (the stack was wiped and brought up again), the sinks try to commit transactions the new cluster
never knew (``InvalidPidMappingException``), every task restart fails the same way and no checkpoint completes
again: the job is refused up front instead.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from streams.job_settings import JobStateError

#: Beside the ``chk-N`` folders of one job run (``<checkpoint_dir>/<job id>/``): the cluster that run read and wrote.
ORIGIN_FILE = "kafka-cluster-id"


def kafka_cluster_id(bootstrap_servers: str, kafka_properties: Mapping[str, str], timeout_s: float = 60.0) -> str:
    """The id of the Kafka cluster at ``bootstrap_servers`` (from its metadata); TimeoutError, with the fix, when no
    broker answers within ``timeout_s``."""
    # log_level 0: a broker that does not answer is reported once, below, not as a log line per connection attempt.
    admin = AdminClient({**kafka_properties, "bootstrap.servers": bootstrap_servers, "log_level": 0})
    try:
        cluster_id = admin.list_topics(timeout=timeout_s).cluster_id
    except KafkaException as err:
        raise TimeoutError(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f} s ({err.args[0].str()}) — fix: start it "
            "(`loopline stack up`) or point kafka.bootstrap_servers at a running broker"
        ) from None
    return cluster_id


def record_origin(job_run_dir: Path, cluster_id: str) -> None:
    """Record that the checkpoints of the job run under ``job_run_dir`` describe the cluster ``cluster_id``."""
    job_run_dir.mkdir(parents=True, exist_ok=True)
    (job_run_dir / ORIGIN_FILE).write_text(cluster_id)


def local_folder(checkpoint: str) -> Path | None:
    """The folder a checkpoint or savepoint location names (a path or ``file://`` URI); None on another filesystem (an
    object store)."""
    if checkpoint.startswith("file:"):
        return Path(urllib.parse.urlparse(checkpoint).path)
    return None if "://" in checkpoint else Path(checkpoint).absolute()


def recorded_origin(checkpoint: str) -> str | None:
    """The cluster recorded for ``checkpoint``: a savepoint's own record (written as it was taken), else its job run's
    (a ``chk-N`` folder's parent); None when none was recorded or it lies on an object store."""
    folder = local_folder(checkpoint)
    if folder is None:
        return None
    for record in (folder / ORIGIN_FILE, folder.parent / ORIGIN_FILE):
        if record.exists():
            return record.read_text().strip()
    return None


def check_origin(checkpoint: str, cluster_id: str, fresh_command: str) -> None:
    """Refuse, with JobStateError saying to run ``fresh_command``, a checkpoint recorded for a cluster other than
    ``cluster_id``. A checkpoint with no record (written before records were kept) passes: the job's watchdog ends a
    restore that never checkpoints."""
    recorded = recorded_origin(checkpoint)
    if recorded is not None and recorded != cluster_id:
        raise JobStateError(
            f"the newest checkpoint ({checkpoint}) describes Kafka cluster {recorded}, but the broker now is cluster "
            f"{cluster_id} (the stack was wiped or Kafka replaced), so it cannot be restored", fresh_command,
        )
