"""``loopline feedback``: the joiner of predictions and late labels."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from loopline.cli import context
from loopline.cli.flink_jobs import (
    FromSavepointOption,
    ImageOption,
    JobManagerOption,
    ParallelismOption,
    PrintCommandOption,
    flink_image,
    submit_to_cluster,
)

app = typer.Typer(help="The feedback loop: predictions joined with late labels into training examples.")


@app.command("join")
def feedback_join(
    restore: Annotated[
        bool, typer.Option(help="Resume from the newest checkpoint; --no-restore starts from the group's offsets.")
    ] = True,
    jobmanager: JobManagerOption = None,
    parallelism: ParallelismOption = None,
    from_savepoint: FromSavepointOption = None,
    print_command: PrintCommandOption = False,
    image: ImageOption = False,
) -> None:
    """Run the feedback joiner (PyFlink): scoring.predictions ⋈ the project's labels → training.examples, embedded (until
    stopped) or submitted to a cluster with its code, Python environment, jars and settings."""
    from loopline.components import joiner_settings

    if jobmanager is None and (from_savepoint or print_command or image):
        raise typer.BadParameter("--from-savepoint, --print-command and --image are for a cluster: give --jobmanager")
    config = context.settings()
    if jobmanager is not None:
        from loopline.cluster_jobs import joiner_submission

        submit_to_cluster(
            joiner_submission(config, jobmanager, parallelism, from_savepoint, restore, flink_image(image)),
            jobmanager,
            print_command,
        )
        return
    from feedback_loop.joiner_job import run_embedded

    context.console.print(f"feedback joiner: horizon {config.feedback.horizon_s:,.0f} s, group {config.feedback.group_id}")
    job = dataclasses.replace(joiner_settings(config), parallelism=parallelism or config.feedback.parallelism)
    run_embedded(job, restore=restore)
