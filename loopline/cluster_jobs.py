"""Loopline's Flink jobs on a Flink cluster: the `flink run` commands that ship them (code, environment, jars and
settings), where they restore from, and stopping them with a savepoint (`stream submit|stop --jobmanager`,
`feedback join --jobmanager`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from infra.flink_cluster import cancel_job, list_jobs, pyflink_home, stop_with_savepoint, submit_job
from loopline.components import feature_plan, job_archives, job_settings, joiner_settings
from loopline.flink_image_job import FEATURE_JOB, IMAGE_ENTRY_MODULE, JOINER
from loopline.settings import Settings
from streams.checkpoint_origin import (
    check_origin,
    kafka_cluster_id,
    local_folder,
    plan_changes,
    record_origin,
    recorded_plan,
    say_rebuilding,
)
from streams.flink_job import latest_checkpoint, savepoint_dir
from streams.flink_submit import FlinkImage, flink_run_command


@dataclass(frozen=True)
class Submission:
    """A job's `flink run` command, what it restores, and the Kafka cluster (and feature plan) its checkpoints will
    describe."""

    command: list[str]
    restore_from: str | None
    checkpoint_dir: str
    bootstrap_servers: str
    kafka_properties: Mapping[str, str]
    #: What starts the job without its checkpoint, should that checkpoint describe another Kafka cluster or plan.
    fresh_command: str
    #: The feature job's plan (view -> identity) as this project compiles it, compiled only when the job is submitted
    #: (a printed command needs no registry); None for the joiner, and for an image's job, which compiles the project
    #: it carries.
    plan: Callable[[], Mapping[str, str]] | None = None
    #: The command that rebuilds the job's state from the log instead, submitted when ``restore_from`` is the newest
    #: checkpoint (not a savepoint named) and holds window state of another ``plan``.
    rebuild_command: list[str] | None = None


def submit(submission: Submission, jobmanager: str) -> str:
    """Run the submission's command against the cluster at ``jobmanager`` and return the job's id: refused (JobStateError)
    when what it restores describes another Kafka cluster, or is a savepoint named of another plan; over the newest
    checkpoint of another plan, the job rebuilds its state from the log instead (``rebuild_command``, said on stderr).
    The new job's checkpoints are recorded as describing this cluster and plan, as an embedded job's are
    (``streams/checkpoint_origin.py``)."""
    cluster_id = kafka_cluster_id(submission.bootstrap_servers, submission.kafka_properties)
    plan = submission.plan() if submission.plan is not None else None
    command, restore_from = submission.command, submission.restore_from
    changes = plan_changes(restore_from, plan) if restore_from and plan is not None and submission.rebuild_command else []
    if changes:
        say_rebuilding(changes, "the feature job")
        command, restore_from = submission.rebuild_command, None
    if restore_from:
        check_origin(restore_from, cluster_id, submission.fresh_command, plan)
    job_id = submit_job(command, jobmanager)
    local = local_folder(submission.checkpoint_dir)
    if local is not None:
        record_origin(local / job_id, cluster_id, plan)
    return job_id


def _restore_point(checkpoint_dir: str, from_savepoint: str | None, restore: bool) -> str | None:
    """What a submitted job restores: ``from_savepoint`` when given, else with ``restore`` the newest checkpoint or
    savepoint under ``checkpoint_dir`` (a local or ``file://`` location; on an object store, name it)."""
    return from_savepoint or (latest_checkpoint(checkpoint_dir) if restore else None)


def _submission(
    settings: Settings,
    entry: str,
    checkpoint_dir: str,
    fresh_command: str,
    jobmanager: str,
    parallelism: int,
    from_savepoint: str | None,
    restore: bool,
    image: FlinkImage | None,
    shipped: Callable[[int, str | None], list[str]],
    plan: Callable[[], Mapping[str, str]] | None = None,
) -> Submission:
    """A job's submission at ``parallelism``: run by a Loopline Flink image's entry as ``entry`` with ``image``, else
    ``shipped(parallelism, restore_from)``, the `flink run` that ships its code and environment (and window state
    under ``plan``)."""
    restore_from = _restore_point(checkpoint_dir, from_savepoint, restore and image is None)
    rebuild_command = None
    if image is not None:
        command = flink_run_command(
            image.flink,
            jobmanager,
            IMAGE_ENTRY_MODULE,
            [entry, str(parallelism)],
            image,
            parallelism=parallelism,
            from_savepoint=restore_from,
        )
    else:
        command = shipped(parallelism, restore_from)
        if restore_from is not None and from_savepoint is None:
            rebuild_command = shipped(parallelism, None)
    return Submission(
        command,
        restore_from,
        checkpoint_dir,
        settings.kafka.bootstrap,
        dict(settings.kafka.client_config),
        f"{fresh_command} --jobmanager {jobmanager} --no-restore",
        plan,
        rebuild_command,
    )


def feature_job_submission(
    settings: Settings,
    jobmanager: str,
    parallelism: int | None,
    from_savepoint: str | None,
    restore: bool,
    image: FlinkImage | None = None,
    start_from_ms: int | None = None,
) -> Submission:
    """The submission of the feature job to the cluster at ``jobmanager``: shipping its code and environment, or with
    ``image`` run by a Loopline Flink image's entry (``loopline/flink_image_job.py``), which reads the settings where
    it runs. Without a checkpoint to restore (``restore`` off, none taken yet, or the newest of another plan) the
    shipped job rebuilds its windows from the oldest retained event, or the first published at ``start_from_ms``."""

    def shipped(parallelism: int, restore_from: str | None) -> list[str]:
        from streams.feature_job import submit_command

        # On a cluster, metrics reporters are the cluster's own configuration, not a port of the job's.
        rebuild = restore_from is None
        job = dataclasses.replace(
            job_settings(settings),
            metrics_port=None,
            parallelism=parallelism,
            rebuild=rebuild,
            start_from_ms=start_from_ms if rebuild else None,
        )
        return submit_command(pyflink_home() / "bin" / "flink", jobmanager, job, job_archives(settings), restore_from)

    return _submission(
        settings,
        FEATURE_JOB,
        settings.checkpoint_dir,
        "loopline stream submit",
        jobmanager,
        parallelism or settings.stream.parallelism,
        from_savepoint,
        restore,
        image,
        shipped,
        None if image is not None else lambda: feature_plan(settings).identities(),
    )


def joiner_submission(
    settings: Settings,
    jobmanager: str,
    parallelism: int | None,
    from_savepoint: str | None,
    restore: bool,
    image: FlinkImage | None = None,
) -> Submission:
    """The submission of the feedback joiner to the cluster at ``jobmanager``: shipping its code and environment, or
    with ``image`` run by a Loopline Flink image's entry."""

    def shipped(parallelism: int, restore_from: str | None) -> list[str]:
        from feedback_loop.joiner_job import submit_command

        job = dataclasses.replace(joiner_settings(settings), metrics_port=None, parallelism=parallelism)
        return submit_command(pyflink_home() / "bin" / "flink", jobmanager, job, job_archives(settings), restore_from)

    return _submission(
        settings,
        JOINER,
        settings.feedback_checkpoint_dir,
        "loopline feedback join",
        jobmanager,
        parallelism or settings.feedback.parallelism,
        from_savepoint,
        restore,
        image,
        shipped,
    )


def running_jobs(jobmanager: str, name: str) -> list[str]:
    """The ids of the cluster's running jobs named ``name``."""
    return [job["id"] for job in list_jobs(jobmanager) if job["name"] == name and job["state"] == "RUNNING"]


def stop_job(jobmanager: str, job_id: str, settings: Settings | None) -> str | None:
    """Stop a job: with ``settings`` gracefully, with a savepoint among its savepoints (under the feature job's
    checkpoint location), whose location is returned (`submit --from-savepoint` resumes from it); without, cancel it
    (its retained checkpoints stay)."""
    if settings is None:
        cancel_job(jobmanager, job_id)
        return None
    savepoint = stop_with_savepoint(jobmanager, job_id, savepoint_dir(settings.checkpoint_dir))
    # The job ran against the settings' Kafka, under the plan its run recorded: the savepoint keeps both records, so a
    # restore from it is checked too.
    taken, run = local_folder(savepoint), local_folder(settings.checkpoint_dir)
    if taken is not None:
        plan = recorded_plan(str(run / job_id)) if run is not None else None
        record_origin(taken, kafka_cluster_id(settings.kafka.bootstrap, settings.kafka.client_config), plan)
    return savepoint
