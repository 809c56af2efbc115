"""What the Flink job commands (``stream submit``, ``feedback join``) share: their cluster options and the submission."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from loopline.cli import context

if TYPE_CHECKING:
    from loopline.cluster_jobs import Submission
    from streams.flink_submit import FlinkImage


JobManagerOption = Annotated[
    str | None, typer.Option("--jobmanager", help="REST host:port of a Flink cluster (default: embedded).")
]


ParallelismOption = Annotated[int | None, typer.Option(min=1, help="The job's parallelism (default: its settings').")]


FromSavepointOption = Annotated[
    str | None, typer.Option(help="With --jobmanager: restore this savepoint or retained checkpoint (any Flink filesystem URI).")
]


PrintCommandOption = Annotated[
    bool, typer.Option(help="With --jobmanager: print the `flink run` command (for a FlinkDeployment's args), submit nothing.")
]


ImageOption = Annotated[
    bool,
    typer.Option(
        help="With --jobmanager: the job as a Loopline Flink image runs it (its Python and jars, settings from "
        "the environment where it runs; a FlinkDeployment's form), shipping nothing."
    ),
]


def flink_image(image: bool) -> FlinkImage | None:
    """The layout of a Loopline Flink image when the job runs in one (``--image``)."""
    from streams.flink_submit import FlinkImage

    return FlinkImage() if image else None


def submit_to_cluster(submission: Submission, jobmanager: str, print_command: bool) -> None:
    """Print the submission's command (one shell line, unwrapped), or submit it and say which job it made."""
    import shlex

    from loopline.cluster_jobs import submit

    if print_command:
        print(shlex.join(submission.command))
        return
    context.console.print(f"submitted to {jobmanager}: job {submit(submission, jobmanager)}", soft_wrap=True)
