"""``loopline flink``: a standalone Flink session cluster from the PyFlink distribution."""

from __future__ import annotations

from typing import Annotated

import typer

from loopline.cli import context
from loopline.tables import stack_table

app = typer.Typer(help="A standalone Flink session cluster (JobManager + TaskManagers) from the PyFlink distribution.")


@app.command("up")
def flink_up(
    taskmanagers: Annotated[int | None, typer.Option(min=1, help="TaskManagers (default flink.taskmanagers).")] = None,
    slots: Annotated[int | None, typer.Option(min=1, help="Task slots per TaskManager (default flink.slots).")] = None,
) -> None:
    """Start the session cluster unless running (its Web UI and REST API on flink.rest_port); print its status."""
    from loopline.components import flink_session

    cluster = flink_session(context.settings(), taskmanagers, slots)
    started = cluster.up()
    context.console.print(stack_table(cluster.status()))
    context.console.print(
        f"started: {', '.join(started) or 'nothing, it runs'}; Web UI and --jobmanager: http://{cluster.address}"
    )


@app.command("status")
def flink_status() -> None:
    """Show the JobManager's and each TaskManager's state, address, pid and log."""
    from loopline.components import flink_session

    context.console.print(stack_table(flink_session(context.settings()).status()))


@app.command("down")
def flink_down() -> None:
    """Stop every TaskManager, then the JobManager (running jobs stop; their retained checkpoints stay)."""
    from loopline.components import flink_session

    stopped = flink_session(context.settings()).down()
    context.console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
