"""What a job's checkpoints describe — the Kafka cluster, and for the feature job the plan of each view — recorded
beside them when the job starts, checked before one is restored.

A checkpoint holds the sources' offsets and the exactly-once sinks' open transactions of one Kafka cluster. Restored
against another (the stack was wiped and brought up again), the sinks try to commit transactions the new cluster
never knew (``InvalidPidMappingException``), every task restart fails the same way and no checkpoint completes
again: the job is refused up front instead.

A view's window state means what its plan said when it was built (``FeaturePlan.identity``: source, keys, event
time, and the aggregations with their windows, slides and kept value types). Flink maps restored state by operator
id alone, so under a changed plan the restored windows would mean something else: tiles of another slide, a replaced
column's values under the new name, a widened window or an added view counting only what arrives after the restore.
A job started over the newest checkpoint of another plan (the project's views changed) does not restore it: it
rebuilds every view from the retained events (``streams/feature_job.py``), and readers switch to the new plan's rows
once they have caught up (``feature_store/view_state.py``). A checkpoint or savepoint named explicitly whose plan
differs is refused in one line, naming the views and the command that rebuilds.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from schemas.kafka_config import admin_settings
from streams.job_settings import JobStateError

#: Beside the ``chk-N`` folders of one job run (``<checkpoint_dir>/<job id>/``): the cluster that run read and wrote.
ORIGIN_FILE = "kafka-cluster-id"
#: Beside them too, for the feature job: each view's plan identity its window state was built under (JSON).
PLAN_FILE = "feature-plan.json"


def kafka_cluster_id(bootstrap_servers: str, kafka_properties: Mapping[str, str], timeout_s: float = 60.0) -> str:
    """The id of the Kafka cluster at ``bootstrap_servers`` (from its metadata); TimeoutError, with the fix, when no
    broker answers within ``timeout_s``."""
    # log_level 0: a broker that does not answer is reported once, below, not as a log line per connection attempt.
    admin = AdminClient(admin_settings(bootstrap_servers, kafka_properties, {"log_level": 0}))
    try:
        cluster_id = admin.list_topics(timeout=timeout_s).cluster_id
    except KafkaException as err:
        raise TimeoutError(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f} s ({err.args[0].str()}) — fix: start it "
            "(`loopline stack up`) or point kafka.bootstrap_servers at a running broker"
        ) from None
    return cluster_id


def record_origin(job_run_dir: Path, cluster_id: str, plan: Mapping[str, str] | None = None) -> None:
    """Record that the checkpoints of the job run under ``job_run_dir`` describe the cluster ``cluster_id`` and, for
    the feature job, window state built under ``plan`` (view -> plan identity)."""
    job_run_dir.mkdir(parents=True, exist_ok=True)
    (job_run_dir / ORIGIN_FILE).write_text(cluster_id)
    if plan is not None:
        # Written whole or not at all: a restore reads it, and a half-written record would be a traceback there.
        partial = job_run_dir / f".{PLAN_FILE}.partial"
        partial.write_text(json.dumps(dict(sorted(plan.items()))))
        os.replace(partial, job_run_dir / PLAN_FILE)


def local_folder(checkpoint: str) -> Path | None:
    """The folder a checkpoint or savepoint location names (a path or ``file://`` URI); None on another filesystem (an
    object store)."""
    if checkpoint.startswith("file:"):
        return Path(urllib.parse.urlparse(checkpoint).path)
    return None if "://" in checkpoint else Path(checkpoint).absolute()


def _recorded(checkpoint: str, name: str) -> str | None:
    """The record ``name`` of ``checkpoint``: a savepoint's own (written as it was taken), else its job run's (a
    ``chk-N`` folder's parent); None when none was kept or it lies on an object store."""
    folder = local_folder(checkpoint)
    if folder is None:
        return None
    for record in (folder / name, folder.parent / name):
        if record.exists():
            return record.read_text().strip()
    return None


def recorded_origin(checkpoint: str) -> str | None:
    """The cluster recorded for ``checkpoint`` (None when none was)."""
    return _recorded(checkpoint, ORIGIN_FILE)


def recorded_plan(checkpoint: str) -> dict[str, str] | None:
    """The plan (view -> identity) recorded for ``checkpoint``; None when none was (not the feature job's, or written
    before plans were recorded)."""
    text = _recorded(checkpoint, PLAN_FILE)
    return None if text is None else json.loads(text)


def plan_changes(checkpoint: str, plan: Mapping[str, str]) -> list[str]:
    """How the plan recorded for ``checkpoint`` differs from the job's ``plan`` (view -> identity), as lines such as
    ``changed: user_stats``; empty when they agree or none was recorded."""
    recorded_views = recorded_plan(checkpoint)
    if recorded_views is None or recorded_views == dict(plan):
        return []
    return [
        f"{what}: {', '.join(views)}"
        for what, views in (
            ("changed", sorted(v for v in plan.keys() & recorded_views.keys() if plan[v] != recorded_views[v])),
            ("added", sorted(plan.keys() - recorded_views.keys())),
            ("removed", sorted(recorded_views.keys() - plan.keys())),
        )
        if views
    ]


def say_rebuilding(changes: list[str], job: str) -> None:
    """Say on stderr that ``job`` rebuilds its views from the retained events instead of restoring the newest
    checkpoint, whose plan differs (``changes``, from :func:`plan_changes`)."""
    print(
        f"{job}: the views changed since the newest checkpoint ({'; '.join(changes)}): rebuilding them from the retained "
        "events; readers keep the previous rows until the rebuild has caught up",
        file=sys.stderr,
        flush=True,
    )


def check_origin(checkpoint: str, cluster_id: str, fresh_command: str, plan: Mapping[str, str] | None = None) -> None:
    """Refuse, with JobStateError saying to run ``fresh_command``, a checkpoint recorded for a cluster other than
    ``cluster_id``, or (given the job's ``plan``) for window state of another plan. A checkpoint with no record
    (written before records were kept) passes: the job's watchdog ends a restore that never checkpoints."""
    recorded = recorded_origin(checkpoint)
    if recorded is not None and recorded != cluster_id:
        raise JobStateError(
            f"the newest checkpoint ({checkpoint}) describes Kafka cluster {recorded}, but the broker now is cluster "
            f"{cluster_id} (the stack was wiped or Kafka replaced), so it cannot be restored",
            fresh_command,
        )
    changes = plan_changes(checkpoint, plan) if plan is not None else []
    if changes:
        raise JobStateError(
            f"the checkpoint {checkpoint} holds window state of another feature plan ({'; '.join(changes)}): "
            "its windows cannot carry over; rebuild them from the retained events",
            fresh_command,
        )
