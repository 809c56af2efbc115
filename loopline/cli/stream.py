"""``loopline stream``: the streaming feature job, embedded or on a Flink cluster."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from loopline.cli import context
from loopline.cli.context import epoch_ms
from loopline.cli.flink_jobs import (
    FromSavepointOption,
    ImageOption,
    JobManagerOption,
    ParallelismOption,
    PrintCommandOption,
    flink_image,
    submit_to_cluster,
)

app = typer.Typer(help="The streaming feature job compiled from the Feast stream feature views.")


@app.command("submit")
def stream_submit(
    jobmanager: JobManagerOption = None,
    restore: Annotated[
        bool,
        typer.Option(help="Resume from the newest checkpoint; --no-restore rebuilds the state from the oldest retained event."),
    ] = True,
    from_time: Annotated[
        str | None,
        typer.Option(help="With --no-restore: rebuild from the events published since this ISO-8601 time instead."),
    ] = None,
    parallelism: ParallelismOption = None,
    from_savepoint: FromSavepointOption = None,
    print_command: PrintCommandOption = False,
    image: ImageOption = False,
) -> None:
    """Run the feature job: on the embedded mini-cluster (until stopped), or submitted to a cluster with its code,
    Python environment, jars and settings."""
    from loopline.components import feature_plan, job_settings

    if from_time is not None and restore:
        raise typer.BadParameter("--from-time rebuilds the state from the log: use it with --no-restore")
    if jobmanager is None and (from_savepoint or print_command or image):
        raise typer.BadParameter("--from-savepoint, --print-command and --image are for a cluster: give --jobmanager")
    config = context.settings()
    if jobmanager is not None:
        from loopline.cluster_jobs import feature_job_submission

        if from_savepoint is not None and not restore:
            raise typer.BadParameter("--from-savepoint restores that savepoint: leave out --no-restore")
        if image and not restore:
            raise typer.BadParameter("a FlinkDeployment's job starts as its upgradeMode says: --no-restore is for a shipped job")
        submission = feature_job_submission(
            config, jobmanager, parallelism, from_savepoint, restore, flink_image(image), epoch_ms(from_time)
        )
        submit_to_cluster(submission, jobmanager, print_command)
        return
    from streams.feature_job import run_embedded

    plan = feature_plan(config)
    context.console.print(f"feature job: {', '.join(v.name for v in plan.views)} from {', '.join(plan.topics)}")
    job = dataclasses.replace(
        job_settings(config), start_from_ms=epoch_ms(from_time), parallelism=parallelism or config.stream.parallelism
    )
    run_embedded(plan, job, restore=restore)


@app.command("status")
def stream_status(jobmanager: JobManagerOption = None) -> None:
    """Show the jobs of a Flink cluster."""
    from infra.flink_cluster import list_jobs
    from loopline.tables import flink_jobs_table

    if jobmanager is None:
        context.console.print(
            "the embedded job lives inside its `loopline stream submit` process; give --jobmanager for a cluster"
        )
        return
    context.console.print(flink_jobs_table(list_jobs(jobmanager), jobmanager))


@app.command("cancel")
def stream_cancel(
    jobmanager: Annotated[str, typer.Option("--jobmanager", help="REST host:port of the Flink cluster.")],
    job_id: Annotated[str | None, typer.Argument(help="Default: every running loopline-features job.")] = None,
) -> None:
    """Cancel the feature job on a Flink cluster (its retained checkpoints stay)."""
    _stop_feature_job(jobmanager, job_id, savepoint=False)


@app.command("stop")
def stream_stop(
    jobmanager: Annotated[str, typer.Option("--jobmanager", help="REST host:port of the Flink cluster.")],
    savepoint: Annotated[bool, typer.Option(help="Take a savepoint under stream.checkpoint_dir; --no-savepoint cancels.")] = True,
    job_id: Annotated[str | None, typer.Argument(help="Default: every running loopline-features job.")] = None,
) -> None:
    """Stop the feature job on a Flink cluster with a savepoint; `stream submit --from-savepoint` resumes from it (at
    any --parallelism)."""
    _stop_feature_job(jobmanager, job_id, savepoint)


def _stop_feature_job(jobmanager: str, job_id: str | None, savepoint: bool) -> None:
    from loopline.cluster_jobs import running_jobs, stop_job
    from streams.job_settings import JOB_NAME

    targets = [job_id] if job_id else running_jobs(jobmanager, JOB_NAME)
    for target in targets:
        location = stop_job(jobmanager, target, context.settings() if savepoint else None)
        context.console.print(
            f"stopped {target} with savepoint {location}" if location else f"cancelling {target}", highlight=False, soft_wrap=True
        )
    if not targets:
        context.console.print("no running feature job")
