"""What every Loopline PyFlink job shares: its environment (jars, checkpoints, restarts, Python bundles,
metrics), and running it embedded with a clear error for a checkpoint it cannot restore.

The feature job (``streams/feature_job.py``) and the feedback joiner (``feedback_loop/joiner_job.py``)
are each a small program on top of these and of their Kafka tables (``streams/kafka_tables.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streams.checkpoint_origin import check_origin, kafka_cluster_id, local_folder, plan_changes, record_origin, say_rebuilding
from streams.job_settings import JobStalled, JobStateError

_REPORTER = "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"
#: A running job completes a checkpoint every interval (seconds); none for this long means its tasks are not running.
#: Long enough for a Flink restart that backs off 10 s, a broker or Redis outage, and a slow mini-cluster start.
STALL_AFTER_S = 180.0
#: What the watchdog prints on the job's stderr each time it runs a stalled job again (the fault drill counts these).
RERUN_NOTE = "running it again from its newest checkpoint"
_WATCH_INTERVAL_S = 2.0


#: Under a job's checkpoint location: where its savepoints go (`loopline stream stop`, Flink's own `stop`).
SAVEPOINTS = "savepoints"


def checkpoint_uri(location: str) -> str:
    """``location`` (a path, or any Flink filesystem URI: ``file:///shared/...``, ``s3://bucket/...``) as a URI."""
    return location if "://" in location else Path(location).absolute().as_uri()


def savepoint_dir(location: str) -> str:
    """Where the savepoints of a job checkpointing under ``location`` go (a URI)."""
    return f"{checkpoint_uri(location)}/{SAVEPOINTS}"


def latest_checkpoint(location: str | Path, completed_after: float | None = None) -> str | None:
    """The newest completed checkpoint or savepoint (a ``<job id>/chk-N`` or ``savepoints/savepoint-*`` folder with
    metadata) under ``location``; None when there is none (completed after ``completed_after``, epoch s, where given),
    or the location is not a local one (on an object store, name the savepoint to restore)."""
    folder = local_folder(str(location))
    if folder is None:
        return None
    completed = [p for p in (*folder.glob("*/chk-*"), *folder.glob(f"{SAVEPOINTS}/savepoint-*")) if (p / "_metadata").exists()]
    if not completed:
        return None
    newest = max(completed, key=lambda p: (p / "_metadata").stat().st_mtime)
    if completed_after is not None and (newest / "_metadata").stat().st_mtime <= completed_after:
        return None
    return str(newest)


def checkpoint_bytes(checkpoint: str | Path | None) -> int:
    """The size of a completed local checkpoint (its folder's files: the metadata, and the state where kept apart);
    0 for None."""
    if checkpoint is None:
        return 0
    return sum(path.stat().st_size for path in Path(checkpoint).rglob("*") if path.is_file())


def _prometheus_reporter_jar() -> Path:
    """Flink's Prometheus metrics reporter, as PyFlink ships it (a plugin)."""
    import pyflink

    (jar,) = (Path(pyflink.__file__).parent / "plugins" / "metrics-prometheus").glob("flink-metrics-prometheus-*.jar")
    return jar


def new_environment(
    *,
    name: str,
    connector_jar: Path,
    operators_jar: Path,
    checkpoint_dir: str,
    checkpoint_interval_ms: int,
    parallelism: int = 1,
    metrics_port: int | None = None,
    restore_from: str | None = None,
    flush_interval_ms: int = 50,
    max_batch_rows: int = 2_000,
    incremental_state: bool = False,
    python_options: Mapping[str, str] | None = None,
):
    """A StreamExecutionEnvironment for the job ``name``: the Kafka connector and the job's JVM operators on its classpath,
    exactly-once checkpoints and savepoints under ``checkpoint_dir`` (a path or any Flink filesystem URI; resuming from
    ``restore_from`` when given), bounded
    restarts, and with ``metrics_port`` its metrics for Prometheus at ``:<port>/metrics`` while it runs embedded. With
    ``incremental_state`` its keyed state lives in RocksDB and each checkpoint writes only what changed since the last
    (for state that grows for days: a heap snapshot copies all of it every interval)."""
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    config = Configuration()
    config.set_string("pipeline.jars", ";".join(jar.as_uri() for jar in (connector_jar, operators_jar)))
    config.set_string("pipeline.name", name)
    # A Python step gets its rows in Arrow batches of up to max_batch_rows, waiting at most
    # flush_interval_ms for one to fill: the knobs that trade freshness for throughput.
    config.set_string("python.fn-execution.bundle.time", str(flush_interval_ms))
    config.set_string("python.fn-execution.bundle.size", str(max_batch_rows))
    config.set_string("python.fn-execution.arrow.batch.size", str(max_batch_rows))
    config.set_string("execution.buffer-timeout.interval", "10 ms")
    # No operator of Loopline's jobs keeps a reference to its input rows, so chained operators can share them.
    config.set_string("pipeline.object-reuse", "true")
    for key, value in (python_options or {}).items():
        config.set_string(key, value)
    if incremental_state:
        config.set_string("state.backend.type", "rocksdb")
        config.set_string("execution.checkpointing.incremental", "true")
    config.set_string("execution.checkpointing.storage", "filesystem")
    config.set_string("execution.checkpointing.dir", checkpoint_uri(checkpoint_dir))
    config.set_string("execution.checkpointing.savepoint-dir", savepoint_dir(checkpoint_dir))
    config.set_string("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION")
    # A failed job (Redis or the broker away) retries with growing pauses; capped at 10 s, and forgotten after a
    # minute of running, so the job works again soon after an outage rather than after Flink's 1-minute cap.
    config.set_string("restart-strategy.type", "exponential-delay")
    config.set_string("restart-strategy.exponential-delay.max-backoff", "10 s")
    config.set_string("restart-strategy.exponential-delay.reset-backoff-threshold", "1 min")
    if restore_from:
        config.set_string("execution.state-recovery.path", restore_from)
    reporter_jars: list[Path] = []
    if metrics_port:
        # The reporter listens on every interface. A port already taken costs only the reporter (Flink logs an
        # error), never the job. On a Flink cluster (`flink run`) reporters are the cluster's own configuration.
        config.set_string("metrics.reporter.prometheus.factory.class", _REPORTER)
        config.set_string("metrics.reporter.prometheus.port", str(metrics_port))
        reporter_jars.append(_prometheus_reporter_jar())
    env = StreamExecutionEnvironment.get_execution_environment(config)
    # The client builds the job graph with the operators' classes, so its class loader needs them too. The
    # embedded mini-cluster it starts looks for reporters there as well: it loads no plugins (it has no plugin
    # manager, whatever FLINK_PLUGINS_DIR says), so the reporter's plugin jar goes on that class loader.
    add_jars_to_context_class_loader([jar.as_uri() for jar in (operators_jar, *reporter_jars)])
    env.set_parallelism(parallelism)
    env.enable_checkpointing(checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    return env


def run_job(
    build: Callable[[str | None], Any],
    name: str,
    checkpoint_dir: str,
    restore: bool,
    fresh_command: str,
    *,
    bootstrap_servers: str,
    kafka_properties: Mapping[str, str],
    stall_after_s: float = STALL_AFTER_S,
    plan: Mapping[str, str] | None = None,
) -> None:
    """Run the job ``build(restore_from)`` makes (an environment with the job on it) until it fails or the process is
    stopped; with ``restore`` from the newest checkpoint under ``checkpoint_dir``. Each run records which Kafka cluster
    (at ``bootstrap_servers``) its checkpoints describe, and the feature job's the ``plan`` (view -> identity) of its
    window state.

    A job that completes no checkpoint for ``stall_after_s`` is cancelled and run again from its newest checkpoint:
    PyFlink's Beam runner can fail the embedded mini-cluster's only task manager while cancelling a task ("Reference
    count must not be negative"), after which the job stays RUNNING with every task SCHEDULED, doing nothing.

    ``build(None)`` builds the job to rebuild its state from the log: where there is no checkpoint, and where the
    newest checkpoint holds window state of another ``plan`` (the views changed: it is not restored).

    JobStateError, saying to run ``fresh_command``, when the checkpoint cannot be restored: it describes another
    Kafka cluster, its state does not fit the job's operators, or the job stalled twice in a row restored from it
    without completing a checkpoint.
    """
    from py4j.protocol import Py4JJavaError

    restore_from = latest_checkpoint(checkpoint_dir) if restore else None
    changes = plan_changes(restore_from, plan) if restore_from and plan is not None else []
    if changes:
        say_rebuilding(changes, name)
        restore_from = None
    stalled_from: str | None = None
    while True:
        cluster_id = kafka_cluster_id(bootstrap_servers, kafka_properties)
        if restore_from:
            check_origin(restore_from, cluster_id, fresh_command, plan)
        try:
            _run_watched(build(restore_from), name, checkpoint_dir, stall_after_s, cluster_id, plan)
            return
        except JobStalled as err:
            newest = latest_checkpoint(checkpoint_dir) or restore_from
            # A second stall from one checkpoint with none completed since: restoring it is what fails, not Beam.
            if restore_from and newest == restore_from == stalled_from:
                raise JobStateError(
                    f"restored from {restore_from}, the job completed no checkpoint in two runs of {stall_after_s:.0f} s: "
                    "the checkpoint cannot be restored",
                    fresh_command,
                ) from None
            stalled_from = restore_from if newest == restore_from else None
            print(f"{name}: {err}; {RERUN_NOTE}", file=sys.stderr, flush=True)
            restore_from = newest
        except Py4JJavaError as err:
            if restore_from and "Cannot map checkpoint/savepoint state" in str(err):
                raise JobStateError(
                    f"the newest checkpoint ({restore_from}) holds the state of a job with other operators "
                    "(Loopline or its definitions changed)",
                    fresh_command,
                ) from None
            raise


def _run_watched(
    env, name: str, checkpoint_dir: str, stall_after_s: float, cluster_id: str, plan: Mapping[str, str] | None
) -> None:
    """Execute the job, record that its checkpoints describe the Kafka cluster ``cluster_id`` (and ``plan``), and wait
    for its end, raising JobStalled (after cancelling it) when no checkpoint completes for ``stall_after_s``."""
    from pyflink.common import JobStatus

    client = env.execute_async(name)
    # Flink keeps each job run's checkpoints in a folder named for its job id.
    local = local_folder(checkpoint_dir)
    if local is not None:
        record_origin(local / str(client.get_job_id()), cluster_id, plan)
    newest, since = latest_checkpoint(checkpoint_dir), time.monotonic()
    while not client.get_job_status().result().is_globally_terminal_state():
        time.sleep(_WATCH_INTERVAL_S)
        now = latest_checkpoint(checkpoint_dir)
        if now != newest:
            newest, since = now, time.monotonic()
        # Checkpoints on an object store are not listed here: no watchdog there (Flink's restarts remain).
        elif (
            local is not None
            and time.monotonic() - since > stall_after_s
            and client.get_job_status().result() == JobStatus.RUNNING
        ):
            client.cancel().result()
            raise JobStalled(f"no checkpoint completed for {stall_after_s:.0f} s")
    client.get_job_execution_result().result()  # raises the job's failure, if it failed


def java_ints(values) -> object:
    """A Java int[] of ``values``, for the JVM operators' constructors (py4j passes no Python list to a varargs one)."""
    from pyflink.java_gateway import get_gateway

    gateway = get_gateway()
    array = gateway.new_array(gateway.jvm.int, len(values))
    for i, value in enumerate(values):
        array[i] = int(value)
    return array
